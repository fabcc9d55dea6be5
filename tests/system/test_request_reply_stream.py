"""The control plane in one process: a master stream (asyncio) and worker streams (threads)."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest
import zmq

from realrl.system.request_reply_stream import MasterStream, RequestTimeoutError, WorkerError
from realrl.system.signed_messages import Codec, ForeignMessageError, Message
from realrl.system.worker_stream import WorkerStream

SECRET = b"s" * 32


class Boom:
    """Unpickling this writes a file: proof that a message was (or was not) unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def serve(codec: Codec, name: str, address: str, n: int, handler, ready: threading.Event | None = None):
    """A worker that answers ``n`` requests with ``handler(data)`` (errors as tracebacks)."""
    stream = WorkerStream(codec, name, address)
    stream.say_hello()
    try:
        served = 0
        while served < n:
            msg = stream.recv(timeout=5)
            if msg is None:
                continue
            try:
                stream.reply(msg, handler(msg.handler, msg.data))
            except Exception as e:  # noqa: BLE001
                stream.reply(msg, error=f"Traceback (most recent call last):\n  ...\n{type(e).__name__}: {e}")
            served += 1
    finally:
        stream.close()


def test_codec_round_trip_and_refusals(tmp_path):
    codec = Codec(SECRET)
    msg = Message("request", "master", "echo", "r1", {"x": [1, 2]})
    assert codec.decode(codec.encode(msg)) == msg
    marker = tmp_path / "unpickled"
    body = pickle.dumps(Boom(str(marker)))
    foreign = Codec(b"x" * 32).encode(Message("request", "intruder"))
    with pytest.raises(ForeignMessageError):
        codec.decode([foreign[0], body])  # another run's signature over our body
    with pytest.raises(ForeignMessageError):
        codec.decode([b"", body])  # unsigned
    with pytest.raises(ForeignMessageError):
        codec.decode([body])  # one frame
    assert not marker.exists()
    with pytest.raises(ValueError):
        Codec(b"short")


def test_round_trip_in_order_and_remote_errors():
    codec = Codec(SECRET)
    seen = []

    def handler(name, data):
        seen.append((name, data))
        if name == "fail":
            raise KeyError("no such thing")
        return data * 2

    async def main():
        master = MasterStream(codec)
        master.start()
        worker = threading.Thread(target=serve, args=(codec, "w0", master.address, 12, handler))
        worker.start()
        await master.wait_hello(["w0"], timeout=10)
        futures = [master.post("w0", "double", i) for i in range(10)]  # posted before any reply
        replies = [await f for f in futures]
        with pytest.raises(WorkerError) as info:
            await master.call("w0", "fail", 0, timeout=5)
        last = await master.call("w0", "double", "ab", timeout=5)
        master.close()
        await asyncio.to_thread(worker.join, 10)
        assert not worker.is_alive()
        return replies, info.value, last

    replies, err, last = asyncio.run(main())
    assert replies == [2 * i for i in range(10)]
    assert [d for n, d in seen[:10]] == list(range(10))  # handled in posting order
    assert err.worker == "w0" and err.handler == "fail" and "KeyError: 'no such thing'" in str(err)
    assert last == "abab"


def test_timeouts_name_the_worker():
    codec = Codec(SECRET)

    async def main():
        master = MasterStream(codec)
        master.start()
        with pytest.raises(RequestTimeoutError, match=r"\['w9'\] did not connect"):
            await master.wait_hello(["w9"], timeout=0.3)
        stream = WorkerStream(codec, "mute", master.address)  # connects, never answers
        stream.say_hello()
        await master.wait_hello(["mute"], timeout=5)
        tik = time.monotonic()
        with pytest.raises(RequestTimeoutError, match="mute did not answer 'work' within 0.3 s") as info:
            await master.call("mute", "work", None, timeout=0.3)
        assert info.value.worker == "mute"
        assert time.monotonic() - tik < 3
        stream.close()
        master.close()

    asyncio.run(main())


def test_master_refuses_foreign_messages_without_unpickling(tmp_path):
    codec = Codec(SECRET)
    marker = tmp_path / "unpickled"

    async def main():
        master = MasterStream(codec)
        master.start()
        ctx = zmq.Context()
        intruder = ctx.socket(zmq.DEALER)
        intruder.setsockopt(zmq.IDENTITY, b"w0")
        intruder.connect(master.address)
        body = pickle.dumps(Boom(str(marker)))
        intruder.send_multipart([b"bad-signature-000000000000000000", body])
        intruder.send_multipart(Codec(b"y" * 32).encode(Message("hello", "w0")))  # another run's hello
        intruder.send_multipart([body])
        deadline = time.monotonic() + 5
        while master.n_refused < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        refused, hello = master.n_refused, set(master.hello)
        intruder.close(linger=0)
        ctx.term()
        master.close()
        return refused, hello

    refused, hello = asyncio.run(main())
    assert refused == 3
    assert hello == set()  # the foreign hello did not count
    assert not marker.exists()


def test_worker_refuses_foreign_messages(tmp_path):
    """A worker bound to a rogue 'master' with another secret never unpickles what it sends."""
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.ROUTER)
    port = rogue.bind_to_random_port("tcp://127.0.0.1")
    stream = WorkerStream(Codec(SECRET), "w0", f"tcp://127.0.0.1:{port}")
    stream.say_hello()
    assert rogue.poll(5000), "the worker's hello never arrived"
    identity = rogue.recv_multipart()[0]
    marker = tmp_path / "unpickled"
    rogue.send_multipart([identity, b"x" * 32, pickle.dumps(Boom(str(marker)))])
    assert stream.recv(timeout=5) is None
    assert stream.n_refused == 1 and not marker.exists()
    stream.close()
    rogue.close(linger=0)
    ctx.term()


def test_heartbeats_detect_a_silent_worker_and_a_lost_master():
    codec = Codec(SECRET)
    lost = threading.Event()

    async def main():
        master = MasterStream(codec)
        master.start()
        beating = WorkerStream(codec, "alive", master.address)
        beating.start_heartbeat(0.1, 30, lambda s: None)
        quiet = WorkerStream(codec, "quiet", master.address)
        quiet.start_heartbeat(0.1, 30, lambda s: None)
        await asyncio.sleep(0.5)
        assert master.silent_workers(["alive", "quiet"], timeout=0.4) == []
        quiet.close()  # stops beating
        await asyncio.sleep(0.8)
        silent = master.silent_workers(["alive", "quiet"], timeout=0.4)
        assert [w for w, _ in silent] == ["quiet"]
        orphan = WorkerStream(codec, "orphan", master.address)
        orphan.start_heartbeat(0.1, 0.5, lambda s: lost.set())
        await asyncio.sleep(0.3)
        master.close()  # the master dies: the worker notices within its timeout
        await asyncio.to_thread(lost.wait, 5)
        beating.close()
        orphan.close()
        return orphan.master_alive

    assert asyncio.run(main()) is False
    assert lost.is_set()


def test_close_does_not_wait_out_the_heartbeat_interval():
    """A worker exits as soon as it is asked: closing stops a heartbeat thread mid-interval."""
    codec = Codec(SECRET)

    async def main():
        master = MasterStream(codec)
        master.start()
        worker = WorkerStream(codec, "w", master.address)
        worker.start_heartbeat(5.0, 30, lambda s: None)
        await asyncio.sleep(0.2)  # the thread is inside its 5 s wait
        t0 = time.monotonic()
        worker.close()
        took = time.monotonic() - t0
        master.close()
        return took

    assert asyncio.run(main()) < 0.5


def test_wait_replies_raises_the_first_failure_and_marks_the_later_ones_seen():
    """Two workers fail one call; the master raises the first error. The second error arrives
    later, and must not surface as asyncio's 'Future exception was never retrieved'."""
    import gc

    from realrl.system.request_reply_stream import wait_replies

    reported = []

    async def scenario():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: reported.append(context["message"]))
        first, second = loop.create_future(), loop.create_future()
        first.set_exception(ValueError("worker 0 failed"))
        with pytest.raises(ValueError, match="worker 0 failed"):
            await wait_replies({0: first, 1: second}, lambda w: f"w{w}", "mfc", timeout=5)
        second.set_exception(ValueError("worker 1 failed"))
        await asyncio.sleep(0)  # done callbacks run
        del first, second
        gc.collect()

    asyncio.run(scenario())
    assert reported == []
