"""Reallocation plans between parallel layouts, checked as geometry (no processes): every
destination box is covered exactly once, by a worker that holds the piece, and a colocated worker
is never sent what it already holds."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from model_fixtures import tiny_config

from realrl.api.core.layout import Layout, Placement
from realrl.impl.model.comm.realloc import model_param_specs, side_for, split_dims_for
from realrl.impl.model.comm.realloc_plan import (
    Box,
    ParamSpec,
    ReallocPlan,
    Side,
    chunk_range,
    gather_broadcast_bytes,
    intersect,
    plan_realloc,
    shard_box,
    volume,
)

CONFIGS = {
    # vocabulary 64 splits over 2 ranks: embedding (tied head) sharded; biases split and whole
    "split-vocab": tiny_config(tied_embedding=True, use_attention_bias=True, use_mlp_bias=True),
    "odd-vocab": tiny_config(vocab_size=97),  # embedding and head whole on every tp rank
}
PLACEMENTS = {  # name -> (placement, fsdp)
    "d1m1": (Placement(Layout(), (0,)), False),
    "d2m1": (Placement(Layout(dp=2), (0, 1)), False),
    "d1m2": (Placement(Layout(tp=2), (0, 1)), False),
    "d2m2": (Placement(Layout(2, 2), (0, 1, 2, 3)), False),
    "d2m1-fsdp": (Placement(Layout(dp=2), (0, 1)), True),
    "d2m2-fsdp": (Placement(Layout(2, 2), (0, 1, 2, 3)), True),
    "d2m1@2": (Placement(Layout(dp=2), (2, 3)), False),
    "d1m1@3": (Placement(Layout(), (3,)), False),
}
COLOCATED = ["d1m1", "d2m1", "d1m2", "d2m2", "d2m1-fsdp", "d2m2-fsdp"]
DISJOINT = [("d1m2", "d2m1@2"), ("d2m1@2", "d1m2"), ("d2m2-fsdp", "d1m1@3"), ("d1m1@3", "d2m2")]
PAIRS = [*itertools.product(COLOCATED, COLOCATED), *DISJOINT]


@functools.cache
def specs(cfg_name: str) -> dict[str, ParamSpec]:
    return model_param_specs(CONFIGS[cfg_name], torch.float32)


@functools.cache
def side(cfg_name: str, name: str) -> Side:
    placement, fsdp = PLACEMENTS[name]
    return side_for(CONFIGS[cfg_name], placement, fsdp)


def disjoint(boxes: list[Box]) -> bool:
    return all(intersect(a, b) is None for a, b in itertools.combinations(boxes, 2))


def inside(box: Box, outer: Box) -> bool:
    return all(o0 <= lo and hi <= o1 for (lo, hi), (o0, o1) in zip(box, outer, strict=True))


def check(plan: ReallocPlan) -> None:
    for name, spec in plan.params.items():
        held = {b for b in plan.src_boxes[name].values() if volume(b) > 0}
        assert disjoint(list(held)) and sum(map(volume, held)) == volume(tuple((0, n) for n in spec.shape))
        for worker, target in plan.dst_boxes[name].items():
            mine = [p for p in plan.pieces if p.param == name and p.dst == worker]
            assert disjoint([p.box for p in mine]), (name, worker)
            assert all(inside(p.box, target) for p in mine)
            assert sum(volume(p.box) for p in mine) == volume(target), (name, worker)
    for p in plan.pieces:
        assert volume(p.box) > 0 and inside(p.box, plan.src_boxes[p.param][p.src])
        if p.src != p.dst and p.dst in plan.src_boxes[p.param]:  # never sent what it holds
            assert intersect(p.box, plan.src_boxes[p.param][p.dst]) is None
    moved = sum(plan.piece_bytes(p) for p in plan.pieces if p.src != p.dst)
    workers = set(plan.src_workers) | set(plan.dst_workers)
    assert sum(plan.bytes_received(w) for w in workers) == moved == plan.total_bytes
    assert sum(plan.bytes_sent(w) for w in workers) == moved
    tags = [plan.tag(s, d) for s, d in plan.pairs()]
    assert len(set(tags)) == len(tags) and all(0 <= t < plan.n_tags for t in tags)


@pytest.mark.parametrize("cfg_name", sorted(CONFIGS))
@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_every_destination_box_is_covered_once_by_a_holder(cfg_name, a, b):
    params = specs(cfg_name)
    plan = plan_realloc(params, side(cfg_name, a), side(cfg_name, b))
    check(plan)
    again = plan_realloc(dict(reversed(params.items())), side(cfg_name, a), side(cfg_name, b))
    assert again.pieces == plan.pieces  # the same on every worker, whatever order it lists params in
    if a == b:
        assert plan.total_bytes == 0 and all(p.src == p.dst for p in plan.pieces)


def test_tp2_to_dp2_colocated_receives_the_other_half():
    """d1m2 -> d2m1 on workers [0, 1]: each worker keeps its half of every split parameter and
    receives the other half; whole parameters never move. The baseline moves more."""
    params = specs("split-vocab")
    plan = plan_realloc(params, side("split-vocab", "d1m2"), side("split-vocab", "d2m1"))
    dims = split_dims_for(CONFIGS["split-vocab"], 2)
    half = sum(
        params[n].itemsize * torch.Size(params[n].shape).numel() // 2
        for n, d in dims.items()
        if d is not None
    )
    assert plan.bytes_received(0) == plan.bytes_received(1) == half
    assert plan.pairs() == [(0, 1), (1, 0)]
    q = [(p.src, p.dst, p.box) for p in plan.pieces if p.param == "layers.0.attn.q.weight"]
    assert q == [
        (0, 0, ((0, 16), (0, 32))),
        (1, 0, ((16, 32), (0, 32))),
        (0, 1, ((0, 16), (0, 32))),
        (1, 1, ((16, 32), (0, 32))),
    ]
    o = [(p.src, p.dst, p.box) for p in plan.pieces if p.param == "layers.0.attn.o.weight" and p.dst == 1]
    assert o == [(0, 1, ((0, 32), (0, 16))), (1, 1, ((0, 32), (16, 32)))]  # row-wise: split on dim 1
    assert all(p.src == p.dst for p in plan.pieces if dims[p.param] is None)
    model = sum(s.itemsize * torch.Size(s.shape).numel() for s in params.values())
    # gather worker 1's halves on worker 0, then the whole model to worker 1
    assert (
        gather_broadcast_bytes(params, side("split-vocab", "d1m2"), side("split-vocab", "d2m1"))
        == half + model
        > 2 * half
    )


def test_replicas_share_the_sending():
    """d2m1 on [0, 1] -> d1m2 on [2, 3]: tp rank 0 reads from replica 0, tp rank 1 from replica 1."""
    cfg = CONFIGS["odd-vocab"]
    to = side_for(cfg, Placement(Layout(tp=2), (2, 3)))
    plan = plan_realloc(specs("odd-vocab"), side("odd-vocab", "d2m1"), to)
    assert plan.pairs() == [(0, 2), (1, 3)]
    assert plan.bytes_sent(0) == plan.bytes_sent(1) == plan.bytes_received(2) == plan.bytes_received(3)


def test_boxes_cut_like_torch_chunk():
    for n, parts in itertools.product(range(10), range(1, 5)):
        got = [chunk_range(n, parts, i) for i in range(parts)]
        sizes = [len(c) for c in torch.arange(n).chunk(parts)] if n else []
        assert [hi - lo for lo, hi in got] == sizes + [0] * (parts - len(sizes))
        assert [r for lo, hi in got for r in range(lo, hi)] == list(range(n))


def test_fsdp_shards_the_tensor_parallel_slice_on_dim_0():
    lay = Layout(2, 2)  # ranks (dp, tp): 0 = (0, 0), 1 = (0, 1), 2 = (1, 0), 3 = (1, 1)
    col = [shard_box((66, 32), lay, 0, True, r) for r in range(4)]  # tp-local 33 rows: 17 + 16
    assert col == [((0, 17), (0, 32)), ((33, 50), (0, 32)), ((17, 33), (0, 32)), ((50, 66), (0, 32))]
    row = [shard_box((32, 48), lay, 1, True, r) for r in range(4)]
    assert row == [((0, 16), (0, 24)), ((0, 16), (24, 48)), ((16, 32), (0, 24)), ((16, 32), (24, 48))]
    assert shard_box((32,), lay, None, True, 3) == ((16, 32),)
    assert shard_box((32, 48), lay, 1, False, 2) == ((0, 32), (0, 24))
    assert [shard_box((3,), Layout(dp=4), None, True, r) for r in range(4)] == [
        ((0, 1),),
        ((1, 2),),
        ((2, 3),),
        ((3, 3),),
    ]
