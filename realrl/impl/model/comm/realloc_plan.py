"""Which worker sends which slice of which parameter when a model moves between two layouts.

ReaL's parameter reallocation ("ReaL: Efficient RLHF Training of Large Language Models with
Parameter Reallocation", MLSys 2025): a model trains in one layout and generates in another, and
its weights move worker to worker. Each layout rank holds a box (a [start, stop) range per dim,
in the whole tensor's coordinates) of every parameter; a destination box is cut along the
distinct source boxes, and each cut comes from one source worker only: the destination itself
when it already holds that source box (colocated layouts send nothing a worker has), otherwise a
replica chosen by the destination's rank, so the load spreads over the source replicas.

A pure function of the two layouts and the parameter shapes: every worker computes the same plan
on its own (no torch.distributed here), and the master or a test can reason about it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from realrl.api.core.layout import Layout, Placement

Box = tuple[tuple[int, int], ...]  # [start, stop) per dim, whole-tensor coordinates


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """A parameter's whole shape and the dtype it travels in (the destination's: slices are cast
    before they are sent, so a worker outside the destination knows what to send)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Side:
    """How one layout holds the model.

    ``split_dims``: parameter -> the dim tensor parallelism splits (None or absent: whole on every
    tp rank); ignored when tp == 1. ``owners``: parameter -> the one tp rank that holds it whole
    (expert parallelism: a routed expert's weights); the other tp ranks hold nothing of it.
    ``fsdp``: dim 0 of the tp-local tensor is further sharded over the dp ranks (FSDP2,
    torch.chunk semantics). ``stages``: parameter -> the pipeline stages that hold it (a tied
    embedding: the first and the last); ignored when pp == 1.
    """

    placement: Placement
    split_dims: Mapping[str, int | None]
    fsdp: bool = False
    owners: Mapping[str, int] = dataclasses.field(default_factory=dict)
    stages: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def box(self, name: str, shape: tuple[int, ...], rank: int) -> Box:
        layout = self.placement.layout
        owner = self.owners.get(name)
        stage, _, t = layout.coords(rank)
        nothing = tuple((0, 0) for _ in shape)
        if owner is not None and layout.tp > 1 and t != owner:
            return nothing
        if layout.pp > 1 and stage not in self.stages[name]:
            return nothing
        return shard_box(shape, layout, self.split_dims.get(name), self.fsdp, rank)


def chunk_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """Rows of part ``index`` when ``n`` rows are cut like ``torch.chunk`` (parts of ceil(n/parts),
    the last ones possibly short or empty): how DTensor's Shard and FSDP2 cut a dim."""
    size = math.ceil(n / parts) if n else 0
    return min(index * size, n), min((index + 1) * size, n)


def shard_box(shape: tuple[int, ...], layout: Layout, split_dim: int | None, fsdp: bool, rank: int) -> Box:
    """The box of a parameter of ``shape`` that layout rank ``rank`` holds."""
    _, d, t = layout.coords(rank)
    box = [(0, n) for n in shape]
    if layout.tp > 1 and split_dim is not None:
        box[split_dim] = chunk_range(shape[split_dim], layout.tp, t)
    if fsdp and layout.dp > 1 and shape:
        start, stop = box[0]
        lo, hi = chunk_range(stop - start, layout.dp, d)
        box[0] = (start + lo, start + hi)
    return tuple(box)


def intersect(a: Box, b: Box) -> Box | None:
    """The common box of ``a`` and ``b``, None when it is empty."""
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return out if all(lo < hi for lo, hi in out) or not out else None


def volume(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def is_empty(box: Box) -> bool:
    return any(hi <= lo for lo, hi in box)


@dataclasses.dataclass(frozen=True)
class Piece:
    """``box`` of ``param`` goes from worker ``src`` to worker ``dst`` (src == dst: a local copy)."""

    param: str
    src: int
    dst: int
    box: Box


@dataclasses.dataclass
class ReallocPlan:
    """Every piece of a reallocation, with the box each worker holds on each side (what the
    workers index their local tensors with)."""

    pieces: list[Piece]
    params: dict[str, ParamSpec]
    src_boxes: dict[str, dict[int, Box]]  # param -> worker -> box it holds in the source
    dst_boxes: dict[str, dict[int, Box]]  # param -> worker -> box it holds in the destination
    src_workers: tuple[int, ...]  # sorted
    dst_workers: tuple[int, ...]  # sorted

    def piece_bytes(self, piece: Piece) -> int:
        return volume(piece.box) * self.params[piece.param].itemsize

    def bytes_received(self, worker: int) -> int:
        """Bytes of the non-local pieces into ``worker``."""
        return sum(self.piece_bytes(p) for p in self.pieces if p.dst == worker and p.src != worker)

    def bytes_sent(self, worker: int) -> int:
        return sum(self.piece_bytes(p) for p in self.pieces if p.src == worker and p.dst != worker)

    @property
    def total_bytes(self) -> int:
        """Bytes that cross between workers (local copies excluded)."""
        return sum(self.piece_bytes(p) for p in self.pieces if p.src != p.dst)

    def pairs(self) -> list[tuple[int, int]]:
        """(src, dst) worker pairs with something to move, sorted."""
        return sorted({(p.src, p.dst) for p in self.pieces if p.src != p.dst})

    def between(self, src: int, dst: int) -> list[Piece]:
        """The pieces ``src`` sends ``dst``, in plan order (the order of one pair's message)."""
        return [p for p in self.pieces if p.src == src and p.dst == dst]

    @property
    def n_tags(self) -> int:
        """How many message tags the plan may use, from its ``first_tag`` on."""
        return len(self.src_workers) * len(self.dst_workers)

    def tag(self, src: int, dst: int) -> int:
        """A pair's message tag, below ``n_tags``: the same on both ends without any exchange."""
        return self.src_workers.index(src) * len(self.dst_workers) + self.dst_workers.index(dst)


def _boxes(params: Mapping[str, ParamSpec], side: Side) -> dict[str, dict[int, Box]]:
    workers = side.placement.workers
    return {
        name: {w: side.box(name, spec.shape, r) for r, w in enumerate(workers)}
        for name, spec in params.items()
    }


def plan_realloc(params: Mapping[str, ParamSpec], src: Side, dst: Side) -> ReallocPlan:
    """Move every parameter of ``params`` from layout ``src`` to layout ``dst``.

    Deterministic: parameters in name order, destination ranks in layout order, source boxes in
    sorted order; the replica that serves a destination rank is the (rank % replicas)-th holder.
    """
    params = dict(sorted(params.items()))
    src_boxes, dst_boxes = _boxes(params, src), _boxes(params, dst)
    pieces = []
    for name in params:
        holders: dict[Box, list[int]] = {}
        for worker, box in src_boxes[name].items():
            if not is_empty(box):
                holders.setdefault(box, []).append(worker)
        for rank, worker in enumerate(dst.placement.workers):
            target = dst_boxes[name][worker]
            for box in sorted(holders):
                cut = intersect(target, box)
                if cut is None:
                    continue
                candidates = sorted(holders[box])
                sender = worker if worker in candidates else candidates[rank % len(candidates)]
                pieces.append(Piece(name, sender, worker, cut))
    return ReallocPlan(
        pieces,
        params,
        src_boxes,
        dst_boxes,
        tuple(sorted(src.placement.workers)),
        tuple(sorted(dst.placement.workers)),
    )


def whole_on(workers: tuple[int, ...] | list[int]) -> Side:
    """Every listed worker holding every parameter whole (a replicated, data-parallel layout)."""
    return Side(Placement.data_parallel(tuple(workers)), {})


def gather_broadcast_plans(
    params: Mapping[str, ParamSpec], src: Side, dst: Side
) -> tuple[ReallocPlan, ReallocPlan]:
    """The baseline ReaL's reallocation is measured against: gather every parameter whole on the
    source's first worker, then send the whole model to every destination worker, which keeps
    its slice."""
    root = src.placement.workers[0]
    gather = plan_realloc(params, src, whole_on([root]))
    broadcast = plan_realloc(params, whole_on([root]), whole_on(dst.placement.workers))
    return gather, broadcast


def gather_broadcast_bytes(params: Mapping[str, ParamSpec], src: Side, dst: Side) -> int:
    """Bytes the gather-then-broadcast baseline moves between workers."""
    return sum(plan.total_bytes for plan in gather_broadcast_plans(params, src, dst))
