"""The control plane: signed request/reply messages between the master and model workers (pyzmq).

The master binds one ROUTER socket; each worker connects a DEALER (identity = its name) for
requests and a second DEALER (``<name>#hb``) from a heartbeat thread. Every message is two frames,
``[hmac, body]``: the body is a pickled ``Message`` signed with the run's secret, and nothing is
unpickled before its signature checks out, so a process outside the run can neither read our
workers' replies into the master nor make a worker execute its pickles.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import os
import pickle
import threading
import time
import traceback
import uuid
from typing import Any

import zmq

from realrl.base import logging

logger = logging.getLogger("request_reply_stream")

HEARTBEAT_SUFFIX = "#hb"


class ForeignMessageError(ValueError):
    """A message whose signature does not match this run's secret."""


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


@dataclasses.dataclass
class Message:
    kind: str  # request | reply | hello | heartbeat | pong
    sender: str
    handler: str = ""
    request_id: str = ""
    data: Any = None
    error: str | None = None  # formatted remote traceback of a failed request


class Codec:
    """HMAC-SHA256 signing of pickled messages with a per-run secret."""

    def __init__(self, secret: bytes):
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError("the run secret must be at least 16 random bytes")
        self.secret = secret

    def encode(self, msg: Message) -> list[bytes]:
        body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        return [hmac.new(self.secret, body, hashlib.sha256).digest(), body]

    def decode(self, frames: list[bytes]) -> Message:
        if len(frames) != 2:
            raise ForeignMessageError(f"expected 2 frames [signature, body], got {len(frames)}")
        mac, body = frames
        if not hmac.compare_digest(mac, hmac.new(self.secret, body, hashlib.sha256).digest()):
            raise ForeignMessageError("signature mismatch: the message is not from this run")
        msg = pickle.loads(body)
        if not isinstance(msg, Message):
            raise ForeignMessageError(f"signed body is a {type(msg).__name__}, not a Message")
        return msg


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


# ----------------------------------------------------------------------------- master side


class MasterStream:
    """The master's end: post requests to named workers, await replies, track heartbeats."""

    def __init__(self, codec: Codec, host: str = "127.0.0.1", name: str = "master"):
        self.codec = codec
        self.name = name
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to an unknown peer raises
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.pending: dict[str, tuple[str, str, asyncio.Future]] = {}
        self.doing: dict[str, str] = {}  # request id -> what it asks, for messages (``in_flight``)
        self.hello: set[str] = set()
        self.last_seen: dict[str, float] = {}
        self.n_refused = 0
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

    def drain(self) -> None:
        """Handle every message waiting in the socket."""
        while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._handle(self.sock.recv_multipart(zmq.NOBLOCK))

    def _handle(self, frames: list[bytes]) -> None:
        identity, frames = frames[0], frames[1:]
        try:
            msg = self.codec.decode(frames)
        except Exception as e:  # noqa: BLE001 - any undecodable message is refused, never fatal
            self.n_refused += 1
            logger.warning("refused a message from %r: %s", identity[:64], e)
            return
        self.last_seen[msg.sender] = time.monotonic()
        if msg.kind == "heartbeat":
            self._send(identity.decode(), Message("pong", self.name))
        elif msg.kind == "hello":
            self.hello.add(msg.sender)
        elif msg.kind == "reply":
            entry = self.pending.pop(msg.request_id, None)
            self.doing.pop(msg.request_id, None)
            if entry is None:
                logger.warning("reply to unknown request %s from %s", msg.request_id, msg.sender)
                return
            worker, handler, fut = entry
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

    def _send(self, identity: str, msg: Message) -> None:
        try:
            self._send_frames([identity.encode(), *self.codec.encode(msg)])
        except zmq.ZMQError as e:
            logger.warning("cannot send %s to %s: %s", msg.kind, identity, e)

    def post(self, worker: str, handler: str, data: Any = None, what: str | None = None) -> asyncio.Future:
        """Send a request now (ordered after every earlier post) and return the reply's future.
        ``what``: the request in words, for a message if the worker is lost before it replies."""
        rid = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = (worker, handler, fut)
        self.doing[rid] = what or handler
        msg = Message("request", self.name, handler, rid, data)
        try:
            self._send_frames([worker.encode(), *self.codec.encode(msg)])
        except zmq.ZMQError as e:
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


# ----------------------------------------------------------------------------- worker side


class WorkerStream:
    """A worker's end: receive requests in order, reply, and keep a heartbeat to the master."""

    def __init__(self, codec: Codec, name: str, master_address: str):
        self.codec = codec
        self.name = name
        self.master_address = master_address
        self.ctx = zmq.Context()
        self.sock = self._connect(name)
        self.n_refused = 0
        self.master_alive = True
        self._stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        # close() writes here to wake the heartbeat thread mid-interval: a worker exits at once
        self._wake_r, self._wake_w = os.pipe()

    def _connect(self, identity: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(self.master_address)
        return sock

    def say_hello(self) -> None:
        self.sock.send_multipart(self.codec.encode(Message("hello", self.name)))

    def recv(self, timeout: float) -> Message | None:
        """The next request, or None after ``timeout`` seconds; foreign messages are dropped."""
        if not self.sock.poll(int(timeout * 1000)):
            return None
        frames = self.sock.recv_multipart()
        try:
            return self.codec.decode(frames)
        except Exception as e:  # noqa: BLE001
            self.n_refused += 1
            logger.warning("%s refused a message: %s", self.name, e)
            return None

    def reply(self, request: Message, data: Any = None, error: str | None = None) -> None:
        msg = Message("reply", self.name, request.handler, request.request_id, data, error)
        self.sock.send_multipart(self.codec.encode(msg))

    def start_heartbeat(self, interval: float, timeout: float, on_master_lost) -> None:
        """Beat every ``interval`` s from a thread; call ``on_master_lost()`` after ``timeout`` s
        without a pong (the master died: a worker must not outlive its run)."""

        def beat() -> None:
            sock = self._connect(self.name + HEARTBEAT_SUFFIX)
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(self._wake_r, zmq.POLLIN)
            last_pong = time.monotonic()
            try:
                while not self._stop.is_set():
                    sock.send_multipart(self.codec.encode(Message("heartbeat", self.name)))
                    deadline = time.monotonic() + interval
                    while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
                        if sock in dict(poller.poll(int(left * 1000))):
                            try:
                                if self.codec.decode(sock.recv_multipart()).kind == "pong":
                                    last_pong = time.monotonic()
                            except ForeignMessageError:
                                self.n_refused += 1
                    if time.monotonic() - last_pong > timeout:
                        self.master_alive = False
                        on_master_lost(time.monotonic() - last_pong)
                        return
            finally:
                sock.close(linger=0)

        self._hb_thread = threading.Thread(target=beat, name=f"{self.name}-heartbeat", daemon=True)
        self._hb_thread.start()

    def close(self) -> None:
        if self._stop.is_set():
            return  # closed already
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.sock.close(linger=0)
        self.ctx.term()
