"""The control plane's master end: post requests to named workers, await their replies.

The master binds one ROUTER socket; each worker connects a DEALER for requests and a second
DEALER from a heartbeat thread (``worker_stream``). Messages are signed, addressed and numbered
(``signed_messages``); this module also holds the errors the master raises about its workers.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

import zmq

from realrl.base import logging
from realrl.system.signed_messages import (
    HEARTBEAT_SUFFIX,
    MASTER,
    Codec,
    ForeignMessageError,
    Message,
    MessageTooLargeError,
    Refusals,
    SequenceCheck,
    limit_receives,
)

logger = logging.getLogger("request_reply_stream")


class RequestTimeoutError(TimeoutError):
    def __init__(self, message: str, worker: str | None = None):
        super().__init__(message)
        self.worker = worker


class WorkerError(RuntimeError):
    """A request failed inside a worker; carries the worker's name and its traceback."""

    def __init__(self, worker: str, handler: str, remote_traceback: str):
        self.worker = worker
        self.handler = handler
        self.remote_traceback = remote_traceback
        super().__init__(f"{worker} failed in {handler!r}:\n{remote_traceback}")


class WorkerLostError(RuntimeError):
    """A worker stopped answering (died, hung, or lost its connection)."""

    def __init__(self, worker: str, reason: str):
        self.worker, self.reason = worker, reason
        super().__init__(f"{worker} is lost: {reason}")


class MasterStream:
    """The master's end: post requests to named workers, await replies, track heartbeats."""

    def __init__(self, codec: Codec, host: str = "127.0.0.1", name: str = MASTER):
        self.codec = codec
        self.name = name
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to an unknown peer raises
        limit_receives(self.sock, codec.max_frame_bytes)
        port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.pending: dict[str, tuple[str, str, asyncio.Future]] = {}
        self.doing: dict[str, str] = {}  # request id -> what it asks, for messages (``in_flight``)
        self.last_done: dict[str, str] = {}  # worker -> the last request it answered, in words
        self.hello: set[str] = set()
        self.last_seen: dict[str, float] = {}
        self.refusals = Refusals(name)
        self.sequences = SequenceCheck()
        self._seq = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.Task | None = None

    def start(self) -> None:
        """Start receiving (call inside the running event loop).

        ZMQ's file descriptor is edge-triggered and every send may swallow a read edge, so the
        socket is drained (until ``EVENTS`` shows nothing to read) on each wake-up, after each
        send, and every 50 ms as a safety net: a reply can never sit unread.
        """
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.sock.getsockopt(zmq.FD), self.drain)
            self._tick = self._loop.create_task(self._tick_loop())
            self._loop.call_soon(self.drain)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            self.drain()

    @property
    def n_refused(self) -> int:
        return self.refusals.n

    def drain(self) -> None:
        """Handle every message waiting in the socket."""
        while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._handle(self.sock.recv_multipart(zmq.NOBLOCK))

    def _handle(self, frames: list[bytes]) -> None:
        identity, frames = frames[0], frames[1:]
        try:
            msg = self.codec.decode(frames)
            if msg.to != self.name:
                raise ForeignMessageError(f"addressed to {msg.to!r}, not to {self.name!r}")
            if identity not in (
                self.codec.identity(msg.sender),
                self.codec.identity(msg.sender + HEARTBEAT_SUFFIX),
            ):
                raise ForeignMessageError(f"signed by {msg.sender!r} but not sent from its connection")
            self.sequences.check(identity, msg.seq)
        except Exception as e:  # noqa: BLE001 - any undecodable message is refused, never fatal
            self.refusals.add(identity, e)
            return
        self.last_seen[msg.sender] = time.monotonic()
        if msg.kind == "heartbeat":
            self._send(identity, Message("pong", self.name, to=msg.sender))
        elif msg.kind == "hello":
            self.hello.add(msg.sender)
        elif msg.kind == "reply":
            entry = self.pending.pop(msg.request_id, None)
            done = self.doing.pop(msg.request_id, None)
            if done is not None:
                self.last_done[msg.sender] = done
            if entry is None:
                logger.warning("reply to unknown request %s from %s", msg.request_id, msg.sender)
                return
            worker, handler, fut = entry
            if worker != msg.sender:  # signed, so a bug rather than an attack: say so
                logger.warning("reply to %s's request %s came from %s", worker, msg.request_id, msg.sender)
            if fut.done():
                return
            if msg.error is not None:
                fut.set_exception(WorkerError(worker, handler, msg.error))
            else:
                fut.set_result(msg.data)

    def _send_frames(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)
        if self._loop is not None:
            self._loop.call_soon(self.drain)  # the send may have consumed a read edge

    def _sign(self, msg: Message) -> list[bytes]:
        msg.seq = next(self._seq)
        return self.codec.encode(msg)

    def _send(self, identity: bytes, msg: Message) -> None:
        try:
            self._send_frames([identity, *self._sign(msg)])
        except zmq.ZMQError as e:
            logger.warning("cannot send %s to %s: %s", msg.kind, msg.to, e)

    def post(self, worker: str, handler: str, data: Any = None, what: str | None = None) -> asyncio.Future:
        """Send a request now (ordered after every earlier post) and return the reply's future.
        ``what``: the request in words, for a message if the worker is lost before it replies."""
        rid = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = (worker, handler, fut)
        self.doing[rid] = what or handler
        msg = Message("request", self.name, handler, rid, data, to=worker)
        try:
            self._send_frames([self.codec.identity(worker), *self._sign(msg)])
        except (zmq.ZMQError, MessageTooLargeError) as e:
            self.pending.pop(rid, None)
            self.doing.pop(rid, None)
            fut.set_exception(WorkerLostError(worker, f"cannot send {handler!r} to it ({e})"))
        return fut

    async def call(self, worker: str, handler: str, data: Any = None, timeout: float = 60.0) -> Any:
        return await wait_reply(self.post(worker, handler, data), worker, handler, timeout)

    async def wait_hello(self, workers: list[str], timeout: float, check=None) -> None:
        """Wait until every worker said hello; ``check()`` may raise for a worker known dead."""
        deadline = time.monotonic() + timeout
        while not set(workers) <= self.hello:
            if check is not None:
                check()
            if time.monotonic() > deadline:
                missing = sorted(set(workers) - self.hello)
                raise RequestTimeoutError(
                    f"workers {missing} did not connect to the master at {self.address} within {timeout} s; "
                    "see their logs under the run folder's logs/",
                    missing[0],
                )
            await asyncio.sleep(0.05)

    def finished_last(self, worker: str) -> str | None:
        """The last request ``worker`` answered (in words), if any."""
        return self.last_done.get(worker)

    def in_flight(self, worker: str) -> list[str]:
        """What ``worker`` was asked and has not answered, oldest first (it runs them in order, so
        the first is what it was doing)."""
        return [
            self.doing[rid] for rid, (w, _, fut) in self.pending.items() if w == worker and not fut.done()
        ]

    def silent_workers(self, workers: list[str], timeout: float) -> list[tuple[str, float]]:
        now = time.monotonic()
        return [
            (w, now - self.last_seen[w])
            for w in workers
            if w in self.last_seen and now - self.last_seen[w] > timeout
        ]

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
        if self._tick is not None:
            self._tick.cancel()
        for _, _, fut in self.pending.values():
            if not fut.done():
                fut.cancel()
        self.refusals.summary()
        self.sock.close(linger=0)
        self.ctx.term()


async def wait_reply(fut: asyncio.Future, worker: str, handler: str, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        raise RequestTimeoutError(f"{worker} did not answer {handler!r} within {timeout} s", worker) from None


async def wait_replies(futures: dict[Any, asyncio.Future], name_of, handler: str, timeout: float) -> dict:
    """The reply of every ``futures[key]`` (the worker named ``name_of(key)``), in order. The first
    failure is raised; the replies not waited for any more get their errors marked as seen (else
    asyncio logs each one as "never retrieved" when it is collected)."""
    replies = {}
    try:
        for key, fut in futures.items():
            replies[key] = await wait_reply(fut, name_of(key), handler, timeout)
    except BaseException:
        for fut in futures.values():
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise
    return replies
