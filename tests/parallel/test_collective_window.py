"""NCCL's blocking window in the check every end-to-end run carries (tests/collective_rules.py):
two ranks that each send three device messages before posting a receive fail, naming the pair,
the group and the messages outstanding; the same exchange as one ``batch_isend_irecv`` passes, as
do sends interleaved with receives, and host messages (gloo's on GPUs too) stay exempt."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from _ranks import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from collective_rules import WINDOW_TIMEOUT_ENV, CollectiveRuleError, check_folder, start  # noqa: E402

N_MESSAGES = 3  # one more than the window
TAG = "_device_discipline_tag"


def _message(i: int, rank: int, where: str | None = None) -> torch.Tensor:
    t = torch.full((i + 1,), float(rank))
    if where is not None:
        setattr(t, TAG, where)
    return t


def _send_all_first(rank: int, recorder, where: str | None = None) -> dict:
    """Each rank sends everything before receiving anything: only buffering lets it through."""
    peer, works, error = 1 - rank, [], None
    try:
        for i in range(N_MESSAGES):
            works.append(dist.isend(_message(i, rank, where), peer, tag=10 + i))
    except CollectiveRuleError as e:
        error = str(e)
    recorder.__exit__(None, None, None)  # take what did go out, outside the check
    got = [dist.recv(torch.empty(i + 1), peer, tag=10 + i) for i in range(len(works))]
    for work in works:
        work.wait()
    return {"error": error, "received": len(got)}


def _sends_first(rank: int, out: str, where: str | None = None) -> dict:
    os.environ[WINDOW_TIMEOUT_ENV] = "1"
    return _send_all_first(rank, start(out), where)


def _host_sends_first(rank: int, out: str) -> dict:
    return _sends_first(rank, out, "host")


def _batched(rank: int, out: str) -> dict:
    os.environ[WINDOW_TIMEOUT_ENV] = "3"
    recorder = start(out)
    peer = 1 - rank
    ops = [dist.P2POp(dist.isend, _message(i, rank), peer, tag=i) for i in range(N_MESSAGES)]
    bufs = [torch.empty(i + 1) for i in range(N_MESSAGES)]
    ops += [dist.P2POp(dist.irecv, b, peer, tag=i) for i, b in enumerate(bufs)]
    for _ in range(2):  # the same batch twice: its receives count once each time
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    values = [float(b[0]) for b in bufs]
    # a receive counted twice would let these through
    return {"values": values, **_send_all_first(rank, recorder)}


def _interleaved(rank: int, out: str) -> list[float]:
    """Rank 0 sends, then receives the reply, then sends again; rank 1 the mirror: each side has
    at most one message without its receive posted."""
    os.environ[WINDOW_TIMEOUT_ENV] = "5"
    start(out)
    peer, got = 1 - rank, []
    for i in range(2 * N_MESSAGES):
        if rank == 0:
            dist.isend(_message(i, rank), peer, tag=i).wait()
            buf = torch.empty(i + 1)
            dist.irecv(buf, peer, tag=i).wait()
        else:
            buf = torch.empty(i + 1)
            dist.irecv(buf, peer, tag=i).wait()
            dist.isend(_message(i, rank), peer, tag=i).wait()
        got.append(float(buf[0]))
    return got


def test_sends_that_need_buffering_fail_on_both_ranks(tmp_path):
    ranks = run_ranks(_sends_first, tmp_path, str(tmp_path))
    for rank, r in enumerate(ranks):
        peer, message = 1 - rank, r["error"]
        assert message is not None, rank
        assert f"rank {rank} -> rank {peer} on group " in message and "window 2" in message, message
        assert "send #2 (tag 12, shape [3], torch.float32) blocks" in message, message
        assert "outstanding: #0 (tag 10, shape [1]" in message and "#1 (tag 11" in message, message
        assert r["received"] == N_MESSAGES - 1


def test_host_messages_are_left_to_gloo(tmp_path):
    ranks = run_ranks(_host_sends_first, tmp_path, str(tmp_path))
    assert [r["error"] for r in ranks] == [None, None]
    assert [r["received"] for r in ranks] == [N_MESSAGES, N_MESSAGES]


def test_the_same_messages_as_one_batch_pass(tmp_path):
    ranks = run_ranks(_batched, tmp_path, str(tmp_path))
    assert [r["values"] for r in ranks] == [[1.0] * N_MESSAGES, [0.0] * N_MESSAGES]
    assert all(r["error"] is not None and "send #8 (tag 12" in r["error"] for r in ranks), ranks


def test_sends_interleaved_with_receives_pass(tmp_path):
    ranks = run_ranks(_interleaved, tmp_path, str(tmp_path))
    assert ranks == [[1.0] * 2 * N_MESSAGES, [0.0] * 2 * N_MESSAGES]
    check_folder(str(tmp_path))
