"""The control plane's worker end: receive the master's requests in order, reply, and keep a
heartbeat to the master from a thread of its own (over a second connection), so a worker busy
in a long call is still known alive and a worker whose master died finds out.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import zmq

from realrl.system.signed_messages import (
    HEARTBEAT_SUFFIX,
    MASTER,
    Codec,
    ForeignMessageError,
    Message,
    MessageTooLargeError,
    Refusals,
    SequenceCheck,
    format_exception,
    limit_receives,
)


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
        limit_receives(sock, self.codec.max_frame_bytes)
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
