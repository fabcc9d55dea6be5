"""The control plane: signed request/reply messages between the master and model workers (pyzmq).

The master binds one ROUTER socket; each worker connects a DEALER for requests and a second
DEALER from a heartbeat thread. Every message is two frames, ``[hmac, body]``: the body is a
pickled ``Message`` signed with the run's secret, and nothing is unpickled before its signature
checks out, so a process outside the run can neither read our workers' replies into the master
nor make a worker execute its pickles.

What else a process without the secret cannot do (docs/security.md):

- claim a worker's connection: a connection's ZMQ identity is derived from the secret and the
  worker's name (``Codec.identity``), and the master accepts a message only from the identity of
  its signed sender, so connecting first under a guessed name neither receives requests nor
  keeps the worker out;
- replay a captured message: every message carries its sender's sequence number and its
  recipient inside the signature; a receiver drops any number not above the last it accepted;
- exhaust memory: frames above ``max_frame_bytes`` drop the connection, every peer's receive
  queue is bounded (``RCV_QUEUE``), and refusals are counted and logged at a limited rate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import itertools
import os
import pickle
import threading
import time
import traceback
import uuid
from collections import Counter
from typing import Any

import zmq

from realrl.base import logging

logger = logging.getLogger("request_reply_stream")

HEARTBEAT_SUFFIX = "#hb"
MASTER = "master"
# the largest frame a peer may send: control messages carry metadata and stats, never tensors
MAX_FRAME_BYTES = 64 << 20
# messages queued per peer connection before ZMQ stops reading from it (back-pressure, no loss)
RCV_QUEUE = 1000
REFUSAL_LOG_INTERVAL = 10.0  # seconds between two log lines about refused messages


class ForeignMessageError(ValueError):
    """A message this run did not send to this receiver: unsigned, another run's, misaddressed,
    replayed, or from a connection that is not its sender's."""


class ReplayedMessageError(ForeignMessageError):
    """A signed message whose sequence number is not above the last accepted from its sender."""


class MessageTooLargeError(ValueError):
    """A message bigger than a receiver accepts (it would drop the connection)."""


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
    to: str = ""  # the recipient's name: a message signed for one peer is refused by the others
    seq: int = 0  # the sender's sequence number on its connection: a replay is not above the last


class Codec:
    """HMAC-SHA256 signing of pickled messages with a per-run secret."""

    def __init__(self, secret: bytes, max_frame_bytes: int = MAX_FRAME_BYTES):
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError("the run secret must be at least 16 random bytes")
        self.secret = secret
        self.max_frame_bytes = max_frame_bytes

    def identity(self, name: str) -> bytes:
        """The ZMQ identity of ``name``'s connection: unguessable without the secret (hex, so
        never starting with the zero byte ZMQ reserves)."""
        mac = hmac.new(self.secret, b"realrl-identity\0" + name.encode(), hashlib.sha256)
        return mac.hexdigest()[:32].encode()

    def encode(self, msg: Message) -> list[bytes]:
        body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        if len(body) > self.max_frame_bytes:
            raise MessageTooLargeError(
                f"a {msg.kind} {msg.handler!r} of {len(body)} bytes exceeds the control plane's "
                f"{self.max_frame_bytes} bytes (MAX_FRAME_BYTES): tensors move between workers, "
                "not through it"
            )
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


class SequenceCheck:
    """The last sequence number accepted from each connection; anything not above it is a replay."""

    def __init__(self):
        self.last: dict[bytes, int] = {}

    def check(self, connection: bytes, seq: int) -> None:
        last = self.last.get(connection, 0)
        if not isinstance(seq, int) or seq <= last:
            raise ReplayedMessageError(f"replayed or stale message (sequence {seq!r}, last accepted {last})")
        self.last[connection] = seq


class Refusals:
    """Refused messages, counted by reason and logged at most once every ``interval`` seconds
    (a flood of junk must not flood the log too)."""

    def __init__(self, who: str, interval: float = REFUSAL_LOG_INTERVAL):
        self.who, self.interval = who, interval
        self.by_reason: Counter[str] = Counter()
        self.n = 0
        self._logged_n = 0
        self._next_log = 0.0
        self._lock = threading.Lock()  # a worker counts from its main and its heartbeat thread

    def add(self, source: bytes | str, error: Exception) -> None:
        reason = "replayed" if isinstance(error, ReplayedMessageError) else type(error).__name__
        with self._lock:
            self.n += 1
            self.by_reason[reason] += 1
            now = time.monotonic()
            if now < self._next_log:
                return
            self._next_log = now + self.interval
            since, self._logged_n = self.n - self._logged_n, self.n
        logger.warning(
            "%s refused a message from %r: %s (%d refused since the last such line, %d in all: %s)",
            self.who,
            source[:64],
            error,
            since,
            self.n,
            dict(self.by_reason),
        )

    def summary(self) -> None:
        """The final tally, which the rate limit may have held back."""
        if self.n > self._logged_n:
            logger.warning("%s refused %d messages in all: %s", self.who, self.n, dict(self.by_reason))


def _bounded(sock: zmq.Socket, max_frame_bytes: int) -> None:
    """A receive queue and a frame size a peer cannot grow without bound; our own sends queue
    unbounded (a worker's requests are posted ahead of time)."""
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, RCV_QUEUE)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.LINGER, 0)


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


# ----------------------------------------------------------------------------- master side


class MasterStream:
    """The master's end: post requests to named workers, await replies, track heartbeats."""

    def __init__(self, codec: Codec, host: str = "127.0.0.1", name: str = MASTER):
        self.codec = codec
        self.name = name
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to an unknown peer raises
        _bounded(self.sock, codec.max_frame_bytes)
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


# ----------------------------------------------------------------------------- worker side


class WorkerStream:
    """A worker's end: receive requests in order, reply, and keep a heartbeat to the master."""

    def __init__(self, codec: Codec, name: str, master_address: str, master: str = MASTER):
        self.codec = codec
        self.name = name
        self.master = master
        self.master_address = master_address
        self.ctx = zmq.Context()
        self.sock = self._connect(name)
        self.refusals = Refusals(name)
        self._seq = itertools.count(1)
        self._sequences = SequenceCheck()  # of the master's messages on the request connection
        self.master_alive = True
        self._stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        # close() writes here to wake the heartbeat thread mid-interval: a worker exits at once
        self._wake_r, self._wake_w = os.pipe()

    @property
    def n_refused(self) -> int:
        return self.refusals.n

    def _connect(self, connection: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.codec.identity(connection))
        _bounded(sock, self.codec.max_frame_bytes)
        sock.connect(self.master_address)
        return sock

    def _accept(self, frames: list[bytes], sequences: SequenceCheck) -> Message | None:
        """The master's message in ``frames``, or None (counted) if this run's master did not
        send it to us just now."""
        try:
            msg = self.codec.decode(frames)
            if msg.to != self.name or msg.sender != self.master:
                raise ForeignMessageError(f"from {msg.sender!r} to {msg.to!r}, not from the master to us")
            sequences.check(b"master", msg.seq)
            return msg
        except Exception as e:  # noqa: BLE001 - any undecodable message is refused, never fatal
            self.refusals.add(self.master_address, e)
            return None

    def _send(self, msg: Message) -> None:
        msg.to, msg.seq = self.master, next(self._seq)
        self.sock.send_multipart(self.codec.encode(msg))

    def say_hello(self) -> None:
        self._send(Message("hello", self.name))

    def recv(self, timeout: float) -> Message | None:
        """The next request, or None after ``timeout`` seconds; foreign messages are dropped."""
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return self._accept(self.sock.recv_multipart(), self._sequences)

    def reply(self, request: Message, data: Any = None, error: str | None = None) -> None:
        try:
            self._send(Message("reply", self.name, request.handler, request.request_id, data, error))
        except MessageTooLargeError as e:  # the master hears why instead of waiting out its timeout
            self._send(
                Message("reply", self.name, request.handler, request.request_id, None, format_exception(e))
            )

    def start_heartbeat(self, interval: float, timeout: float, on_master_lost) -> None:
        """Beat every ``interval`` s from a thread; call ``on_master_lost()`` after ``timeout`` s
        without a pong (the master died: a worker must not outlive its run)."""

        def beat() -> None:
            sock = self._connect(self.name + HEARTBEAT_SUFFIX)
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(self._wake_r, zmq.POLLIN)
            seq, sequences = itertools.count(1), SequenceCheck()  # this connection's own
            last_pong = time.monotonic()
            try:
                while not self._stop.is_set():
                    beat = Message("heartbeat", self.name, to=self.master, seq=next(seq))
                    sock.send_multipart(self.codec.encode(beat))
                    deadline = time.monotonic() + interval
                    while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
                        if sock in dict(poller.poll(int(left * 1000))):
                            msg = self._accept(sock.recv_multipart(), sequences)
                            if msg is not None and msg.kind == "pong":
                                last_pong = time.monotonic()
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
        self.refusals.summary()
        self.sock.close(linger=0)
        self.ctx.term()
