"""Attacks on the control plane, in one process: a master stream, workers as threads, and an
intruder's ZMQ sockets on the same machine (docs/security.md)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
import zmq

from realrl.api.core.system_api import Timeouts
from realrl.base.name_resolve import make_repository
from realrl.system import names
from realrl.system.request_reply_stream import MasterStream, WorkerError
from realrl.system.signed_messages import (
    HEARTBEAT_SUFFIX,
    MAX_FRAME_BYTES,
    RCV_QUEUE,
    Codec,
    Message,
    MessageTooLargeError,
)
from realrl.system.worker_base import SeenIds, WorkerBase
from realrl.system.worker_stream import WorkerStream

SECRET = b"s" * 32


def serve(codec: Codec, name: str, address: str, n: int, handler=lambda h, d: d) -> None:
    """A worker with heartbeats that answers ``n`` requests with ``handler(name, data)``."""
    stream = WorkerStream(codec, name, address)
    stream.say_hello()
    stream.start_heartbeat(0.1, 30, lambda s: None)
    try:
        served = 0
        while served < n:
            msg = stream.recv(timeout=5)
            if msg is not None:
                stream.reply(msg, handler(msg.handler, msg.data))
                served += 1
    finally:
        stream.close()


def intruder(ctx: zmq.Context, address: str, identity: bytes) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


async def poll(sock: zmq.Socket, ms: int) -> int:
    """``sock.poll`` off the event loop, which must keep serving the master meanwhile."""
    return await asyncio.to_thread(sock.poll, ms)


async def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def test_an_intruder_connected_first_under_a_workers_name_gets_nothing_and_stops_nothing():
    """Connecting first as ``w0`` / ``w0#hb`` once received the master's requests and kept the
    worker's heartbeat out (the run failed); identities now come from the secret."""
    codec = Codec(SECRET)

    async def main():
        master = MasterStream(codec)
        master.start()
        ctx = zmq.Context()
        squatters = [intruder(ctx, master.address, n.encode()) for n in ("w0", "w0" + HEARTBEAT_SUFFIX)]
        for s in squatters:
            s.send_multipart([b"x" * 32, b"junk"])  # makes sure each connection is in place first
        await wait_for(lambda: master.n_refused >= 2)
        worker = threading.Thread(target=serve, args=(codec, "w0", master.address, 4))
        worker.start()
        await master.wait_hello(["w0"], timeout=10)
        replies = [await master.call("w0", "echo", i, timeout=5) for i in range(3)]
        await asyncio.sleep(0.3)  # heartbeats flow
        silent = master.silent_workers(["w0"], timeout=0.25)
        got = [await poll(s, 100) for s in squatters]
        await master.call("w0", "echo", "last", timeout=5)
        await asyncio.to_thread(worker.join, 10)
        for s in squatters:
            s.close()
        ctx.term()
        master.close()
        return replies, silent, got

    replies, silent, got = asyncio.run(main())
    assert replies == [0, 1, 2]
    assert silent == []  # the worker's own heartbeat reached the master
    assert got == [0, 0]  # neither squatter received a request or a pong


def test_replayed_hello_heartbeat_and_reply_are_dropped_and_counted():
    """A captured signed message sent again (even from the sender's own identity, as an
    eavesdropper on the network could) is refused: its sequence number is not new."""
    codec = Codec(SECRET)

    async def main():
        master = MasterStream(codec)
        master.start()
        ctx = zmq.Context()
        sock = intruder(ctx, master.address, codec.identity("w0"))  # as if the identity were sniffed
        hb = intruder(ctx, master.address, codec.identity("w0" + HEARTBEAT_SUFFIX))
        hello = codec.encode(Message("hello", "w0", to="master", seq=1))
        sock.send_multipart(hello)
        await master.wait_hello(["w0"], timeout=5)
        beat = codec.encode(Message("heartbeat", "w0", to="master", seq=1))
        hb.send_multipart(beat)
        assert await poll(hb, 5000), "no pong to the first heartbeat"
        hb.recv_multipart()
        fut = master.post("w0", "train", None)
        assert await poll(sock, 5000)
        request = codec.decode(sock.recv_multipart())
        reply = codec.encode(Message("reply", "w0", "train", request.request_id, "r1", to="master", seq=2))
        sock.send_multipart(reply)
        first = await asyncio.wait_for(fut, 5)
        seen = master.last_seen["w0"]
        await asyncio.sleep(0.1)
        hb.send_multipart(beat)  # replayed heartbeat: no pong, the worker is not seen again
        again = master.post("w0", "train", None)  # a second request, answered by a replayed reply?
        sock.send_multipart(reply)
        sock.send_multipart(hello)
        await wait_for(lambda: master.refusals.by_reason["replayed"] >= 3)
        pong_to_replay = await poll(hb, 200)
        result = dict(
            first=first,
            replayed=master.refusals.by_reason["replayed"],
            second_pending=not again.done(),
            seen_again=master.last_seen["w0"] != seen,
            pong_to_replay=pong_to_replay,
        )
        sock.close()
        hb.close()
        ctx.term()
        master.close()
        return result

    result = asyncio.run(main())
    assert result == dict(first="r1", replayed=3, second_pending=True, seen_again=False, pong_to_replay=0)


def test_a_worker_drops_a_replayed_request_and_a_misaddressed_one():
    """The master's signed request captured on the way to one worker, sent again to it or to
    another: refused by the stream."""
    codec = Codec(SECRET)
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.ROUTER)  # stands in for a peer that captured the master's frames
    port = rogue.bind_to_random_port("tcp://127.0.0.1")
    stream = WorkerStream(codec, "w0", f"tcp://127.0.0.1:{port}")
    stream.say_hello()
    assert rogue.poll(5000)
    identity = rogue.recv_multipart()[0]
    request = codec.encode(Message("request", "master", "mfc", "r1", to="w0", seq=5))
    rogue.send_multipart([identity, *request])
    assert stream.recv(timeout=5).request_id == "r1"
    rogue.send_multipart([identity, *request])  # replayed
    rogue.send_multipart([identity, *codec.encode(Message("request", "master", "mfc", "r2", to="w1", seq=6))])
    assert stream.recv(timeout=2) is None and stream.recv(timeout=2) is None
    assert stream.refusals.n == 2 and stream.refusals.by_reason["replayed"] == 1
    stream.close()
    rogue.close(linger=0)
    ctx.term()


def test_a_worker_runs_each_request_id_once():
    """Even a request the master signed twice with one id (the stream's check missed nothing
    here: both are new messages) runs once: a repeated ``mfc`` would be an extra training step."""
    codec = Codec(SECRET)
    record = make_repository("memory")
    calls = []

    class Counting(WorkerBase):
        def __init__(self):
            super().__init__("w0", codec, record, "e", "t", Timeouts(), exit_on_master_lost=False)
            self.handlers = {"mfc": lambda data: calls.append(data)}

    async def main():
        master = MasterStream(codec)
        master.start()
        record.add(names.master_stream("e", "t"), master.address)
        worker = Counting()
        thread = threading.Thread(target=worker.run)
        thread.start()
        await master.wait_hello(["w0"], timeout=10)
        for _ in range(2):
            master._send(codec.identity("w0"), Message("request", "master", "mfc", "same-id", 1, to="w0"))
        await master.call("w0", "mfc", 2, timeout=5)  # a fresh id still runs
        await master.call("w0", "exit", timeout=5)
        await asyncio.to_thread(thread.join, 10)
        master.close()
        return worker.n_repeated

    assert asyncio.run(main()) == 1
    assert calls == [1, 2]


def test_seen_ids_forget_only_beyond_their_window():
    seen = SeenIds(capacity=3)
    assert [seen.first_time(i) for i in "abcadba"] == [True, True, True, False, True, False, True]
    assert len(seen.ids) == 3  # "d" pushed out "a", the oldest


def test_a_flood_of_junk_is_counted_and_logged_a_few_times(caplog):
    """2,000 junk messages once wrote 2,000 log lines; now they are counted, a line at most
    every 10 s, and a worker is served meanwhile."""
    codec = Codec(SECRET)
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("realrl.request_reply_stream")
    log.addHandler(handler)

    async def main():
        master = MasterStream(codec)
        master.start()
        ctx = zmq.Context()
        flood = intruder(ctx, master.address, b"\xff\xfe-not-utf8")
        for i in range(2000):
            flood.send_multipart([b"%032d" % i, b"junk"])
        worker = threading.Thread(target=serve, args=(codec, "w0", master.address, 1))
        worker.start()
        await master.wait_hello(["w0"], timeout=10)
        echoed = await master.call("w0", "echo", "ok", timeout=10)
        await wait_for(lambda: master.n_refused >= 2000, timeout=10)
        await asyncio.to_thread(worker.join, 10)
        flood.close()
        ctx.term()
        master.close()
        return echoed, master.n_refused

    try:
        echoed, refused = asyncio.run(main())
    finally:
        log.removeHandler(handler)
    assert echoed == "ok" and refused == 2000
    refusal_lines = [line for line in lines if "refused" in line]
    assert 1 <= len(refusal_lines) <= 2, refusal_lines


def test_a_signed_message_from_a_foreign_or_non_utf8_identity_is_refused_without_raising():
    """The reply to a heartbeat once decoded the sender's identity outside the error handling:
    a non-UTF-8 identity raised out of ``drain()``. Now the identity must be the sender's own."""
    codec = Codec(SECRET)

    async def main():
        master = MasterStream(codec)
        master.start()
        ctx = zmq.Context()
        sock = intruder(ctx, master.address, b"\xff\xfe")
        sock.send_multipart(codec.encode(Message("heartbeat", "w0", to="master", seq=1)))
        await wait_for(lambda: master.n_refused >= 1)
        master.drain()
        result = master.n_refused, dict(master.last_seen), await poll(sock, 200)
        sock.close()
        ctx.term()
        master.close()
        return result

    assert asyncio.run(main()) == (1, {}, 0)


def test_a_huge_frame_drops_the_sender_not_the_master():
    """A frame above the limit closes the sender's connection before it is buffered (a 100 MB
    frame once raised the master's memory by 200 MB); the run's workers go on."""
    codec = Codec(SECRET, max_frame_bytes=1 << 20)

    async def main():
        master = MasterStream(codec)
        master.start()
        ctx = zmq.Context()
        big = intruder(ctx, master.address, b"big")
        big.send_multipart([b"x" * 32, b"x" * (8 << 20)])
        worker = threading.Thread(target=serve, args=(codec, "w0", master.address, 1))
        worker.start()
        await master.wait_hello(["w0"], timeout=10)
        echoed = await master.call("w0", "echo", "ok", timeout=10)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(worker.join, 10)
        big.close()
        ctx.term()
        result = echoed, master.n_refused, master.sock.getsockopt(zmq.RCVHWM)
        master.close()
        return result

    echoed, refused, rcvhwm = asyncio.run(main())
    assert echoed == "ok"
    assert refused == 0  # never received: ZMQ dropped the connection at the frame's header
    assert 0 < rcvhwm == RCV_QUEUE  # a bounded queue per peer
    assert MAX_FRAME_BYTES <= 1 << 30


def test_a_message_too_large_is_refused_at_its_sender_with_a_clear_error():
    """A worker whose reply is too large answers with the error instead of being cut off."""
    codec = Codec(SECRET, max_frame_bytes=1 << 16)
    with pytest.raises(MessageTooLargeError, match="exceeds the control plane"):
        codec.encode(Message("reply", "w0", "mfc", "r", b"x" * (1 << 17), to="master"))

    async def main():
        master = MasterStream(codec)
        master.start()
        worker = threading.Thread(
            target=serve, args=(codec, "w0", master.address, 1, lambda h, d: b"x" * (1 << 17))
        )
        worker.start()
        await master.wait_hello(["w0"], timeout=10)
        with pytest.raises(WorkerError, match="MessageTooLargeError"):
            await master.call("w0", "big", None, timeout=10)
        await asyncio.to_thread(worker.join, 10)
        master.close()

    asyncio.run(main())


def test_identities_depend_on_the_secret():
    a, b = Codec(SECRET), Codec(b"t" * 32)
    assert a.identity("w0") != b.identity("w0") and a.identity("w0") != a.identity("w1")
    assert a.identity("w0") == Codec(SECRET).identity("w0") and b"w0" not in a.identity("w0")
