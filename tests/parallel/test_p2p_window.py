"""The point-to-point window check itself, on two gloo ranks: unbatched sends both ways beyond
the window fail on both ranks, naming the pair, the tags and the messages outstanding; the same
messages posted as one batch pass; a receive of the wrong shape fails naming both messages."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from _ranks import run_ranks
from p2p_window import P2PWindowError, windowed_p2p

N_MESSAGES = 3  # one more than the window


def _error(fn) -> str | None:
    try:
        fn()
    except P2PWindowError as e:
        return str(e)
    return None


def worker(rank: int, store_path: str) -> dict:
    p2p = windowed_p2p(store_path, 2, window=2, timeout_s=1.0)
    peer = 1 - rank
    out, works = {}, []

    def sends_first() -> None:  # each rank sends everything before receiving anything
        for i in range(N_MESSAGES):
            works.append(p2p.isend(torch.full((i + 1,), float(rank)), peer, tag=10 + i))

    out["unbatched"] = _error(sends_first)
    for i in range(N_MESSAGES - 1):  # take what did go out, outside the check
        dist.recv(torch.empty(i + 1), peer, tag=10 + i)
    for work in works:
        work.wait()

    p2p = windowed_p2p(store_path + ".batch", 2, window=2, timeout_s=5.0)
    ops = [dist.P2POp(dist.isend, torch.full((i + 1,), float(rank)), peer, tag=i) for i in range(N_MESSAGES)]
    bufs = [torch.empty(i + 1) for i in range(N_MESSAGES)]
    ops += [dist.P2POp(dist.irecv, b, peer, tag=i) for i, b in enumerate(bufs)]
    for work in p2p.batch_isend_irecv(ops):
        work.wait()
    out["batched"] = [float(b[0]) for b in bufs]

    p2p = windowed_p2p(store_path + ".shape", 2, window=2, timeout_s=5.0)
    if rank == 0:
        p2p.isend(torch.zeros(2, 3), 1).wait()
        out["shape"] = None
    else:
        out["shape"] = _error(lambda: p2p.recv(torch.empty(3, 2), 0))
        dist.recv(torch.empty(2, 3), 0)
    return out


def test_the_window_check_catches_sends_that_need_buffering(tmp_path):
    ranks = run_ranks(worker, tmp_path, os.path.join(tmp_path, "store"), n=2)
    for rank, r in enumerate(ranks):
        peer = 1 - rank
        message = r["unbatched"]
        assert message is not None, rank
        assert f"rank {rank} -> rank {peer}" in message and "window 2" in message, message
        assert "#2 (tag 12, shape [3], torch.float32) blocks" in message, message
        assert "outstanding: #0 (tag 10" in message and "#1 (tag 11" in message, message
        assert r["batched"] == [float(peer)] * N_MESSAGES
    assert ranks[0]["shape"] is None
    assert "rank 0 sent #0 (tag 0, shape [2, 3]" in ranks[1]["shape"]
    assert "receives #0 (tag 0, shape [3, 2]" in ranks[1]["shape"]
