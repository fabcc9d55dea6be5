"""The control plane's messages: signed, addressed, numbered frames, shared by both ends.

Every message is two frames, ``[hmac, body]``: the body is a pickled ``Message`` signed with
the run's secret, and nothing is unpickled before its signature checks out, so a process outside
the run can neither read our workers' replies into the master nor make a worker execute its
pickles. The master's end is ``request_reply_stream``, a worker's ``worker_stream``.

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

import dataclasses
import hashlib
import hmac
import pickle
import threading
import time
import traceback
from collections import Counter
from typing import Any

import zmq

from realrl.base import logging

logger = logging.getLogger("request_reply_stream")  # the control plane's one log

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


def limit_receives(sock: zmq.Socket, max_frame_bytes: int) -> None:
    """A receive queue and a frame size a peer cannot grow without bound; our own sends queue
    unbounded (a worker's requests are posted ahead of time)."""
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, RCV_QUEUE)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.LINGER, 0)


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
