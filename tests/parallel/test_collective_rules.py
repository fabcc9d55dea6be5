"""The NCCL-rules check (tests/collective_rules.py) passes a schedule that keeps NCCL's rules and
fails each deliberately broken one: dtype across ranks, group order, host and device tensors in
one call, a non-contiguous tensor, messages matched by tag instead of in order, a call on a group
the rank is not in."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
from _ranks import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from collective_rules import Call, CollectiveRuleError, check_folder, problems, start  # noqa: E402

TAG = "_device_discipline_tag"


def _guarded(fn):
    """Run ``fn`` under the check; a local rule's error comes back as text (both ranks break the
    same rule, so neither waits in a collective its peer never joins)."""
    try:
        fn()
        return None
    except CollectiveRuleError as e:
        return str(e)


def _good(rank, out):
    start(out)
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    gathered = torch.empty(8)
    dist.all_gather_into_tensor(gathered, t)
    pair = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(3, dtype=torch.bfloat16), group=pair)
    if rank == 0:
        dist.isend(torch.ones(2), dst=1, tag=1).wait()
        dist.isend(torch.ones(3, dtype=torch.int64), dst=1, tag=2).wait()
    else:
        dist.irecv(torch.empty(2), src=0, tag=1).wait()
        dist.irecv(torch.empty(3, dtype=torch.int64), src=0, tag=2).wait()
    from torch.distributed._functional_collectives import all_reduce as functional_all_reduce

    functional_all_reduce(torch.ones(5), "sum", dist.group.WORLD).wait()


def _dtype_across_ranks(rank, out):
    start(out)
    # same bytes, so gloo copies them without complaint; NCCL requires one dtype on every rank
    t = torch.ones(4) if rank == 0 else torch.ones(4, dtype=torch.int32)
    dist.broadcast(t, src=0)


def _device_mix(rank, out):
    start(out)
    device, host = torch.ones(2), torch.empty(4)
    setattr(device, TAG, "device")
    setattr(host, TAG, "host")
    return _guarded(lambda: dist.all_gather_into_tensor(host, device))


def _non_contiguous(rank, out):
    start(out)
    return _guarded(lambda: dist.all_reduce(torch.ones(3, 2).t()))


def _by_tag(rank, out):
    start(out)
    if rank == 0:
        a = dist.isend(torch.ones(2), dst=1, tag=1)
        b = dist.isend(torch.ones(3), dst=1, tag=2)
    else:  # receives posted in the other order: gloo matches tags, NCCL order
        b = dist.irecv(torch.empty(3), src=0, tag=2)
        a = dist.irecv(torch.empty(2), src=0, tag=1)
    a.wait()
    b.wait()


def _not_a_member(rank, out):
    start(out)
    other = dist.new_group([1])
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(2), group=other)
        except UserWarning as e:  # older torch skips the call with a warning: the check raises it
            return str(e)
        except ValueError as e:  # torch 2.13 refuses the call itself
            return str(e)
    return None


def test_a_schedule_that_keeps_the_rules_passes(tmp_path):
    run_ranks(_good, tmp_path, str(tmp_path))
    assert check_folder(str(tmp_path)) >= 14  # every call recorded: 6 collectives + 2 p2p a rank


@pytest.mark.parametrize(
    "schedule, expected",
    [
        (_dtype_across_ranks, "rank 1 issued broadcast_"),
        (_by_tag, "in order"),
    ],
    ids=["dtype", "p2p_by_tag"],
)
def test_a_broken_schedule_is_named_after_the_run(tmp_path, schedule, expected):
    run_ranks(schedule, tmp_path, str(tmp_path))
    with pytest.raises(CollectiveRuleError, match=expected):
        check_folder(str(tmp_path))


@pytest.mark.parametrize(
    "schedule, expected",
    [(_device_mix, "host and device tensors"), (_non_contiguous, "non-contiguous")],
    ids=["device", "contiguity"],
)
def test_a_broken_call_fails_where_it_is_issued(tmp_path, schedule, expected):
    errors = run_ranks(schedule, tmp_path, str(tmp_path))
    assert all(e is not None and expected in e for e in errors), errors


def test_a_call_on_a_group_the_rank_is_not_in_fails(tmp_path):
    errors = run_ranks(_not_a_member, tmp_path, str(tmp_path))
    assert errors[0] is not None and ("does not belong" in errors[0] or "Invalid process group" in errors[0])


def test_groups_two_ranks_share_created_in_another_order_are_named():
    """Records as the ranks would write them (a mismatched creation order hangs gloo too, at the
    groups' rendezvous, so it is shown on records): the groups ranks 0 and 1 share, [0, 1] and
    [0, 1, 2], made in two orders. Groups each rank makes alone (DeviceMesh's split groups) may
    come in any order."""
    world = "w"
    created = {
        (world, 0): [[0, 1, 2], [0], [0, 1], [0, 1, 2]],
        (world, 1): [[0, 1, 2], [1], [0, 1, 2], [0, 1]],
    }
    assert problems([], {k: v[:2] for k, v in created.items()}) == []  # [0] and [1]: each its own
    (found,) = problems([], created)
    assert "new_group order" in found and "[0, 1] on rank 0 but [0, 1, 2] on rank 1" in found


def test_a_rooted_gather_passes_and_another_dtype_does_not():
    """``gather_object`` on two ranks: the root passes its input and both outputs, the other rank
    its input alone (NCCL's gather as torch issues it); one dtype on both is all NCCL needs."""

    def gather(rank, n, dtype="torch.uint8"):
        return Call("w", rank, "gather_", "g", [0, 1], [[5]] * n, [dtype] * n)

    assert problems([gather(0, 3), gather(1, 1)], {}) == []
    (found,) = problems([gather(0, 3), gather(1, 1, "torch.int8")], {})
    assert (
        "collective 0: rank 0 issued gather_" in found
        and "rank 1 issued gather_ [[5]] ['torch.int8']" in found
    )
