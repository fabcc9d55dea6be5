"""The baseline parameter reallocation is measured against: gather every parameter whole on one
worker, then send the whole model to every destination worker, which keeps its slice (what a
system that only moves whole models does). It runs as two plans through the same ``move`` as
the real thing, so a comparison measures the plans, not the transport."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from realrl.impl.model.comm.realloc import ReallocStats, Tensors, local_tensors, move, reshard_fsdp
from realrl.impl.model.comm.realloc_plan import ParamSpec, Side, gather_broadcast_plans


def _whole(params: Mapping[str, ParamSpec], device: torch.device) -> Tensors:
    return {n: torch.empty(spec.shape, dtype=spec.dtype, device=device) for n, spec in params.items()}


@torch.no_grad()
def gather_broadcast(
    params: Mapping[str, ParamSpec],
    src: Side,
    dst: Side,
    me: int,
    src_module: nn.Module | None,
    dst_module: nn.Module | None,
    timeout_s: float,
    first_tag: int = 0,
) -> ReallocStats:
    """The baseline of the benchmark: every parameter gathered whole on the source's first worker,
    the whole model sent from there to every destination worker, each keeping its slice. Same
    calling rules as ``reallocate``; the gather's tags start at ``first_tag``, the broadcast's
    right after them."""
    gather, broadcast = gather_broadcast_plans(params, src, dst)
    if me not in gather.src_workers and me not in broadcast.dst_workers:
        return ReallocStats(0, 0, 0.0)
    if src_module is not None:
        reshard_fsdp(src_module)
    src_t = local_tensors(src_module, gather.src_boxes, me, "source") if me in gather.src_workers else None
    dst_t: Tensors = {}
    dst_boxes: dict[str, dict[int, tuple]] = {}
    if me in broadcast.dst_workers:  # the broadcast plan holds whole tensors: boxes of the layout
        rank = dst.placement.workers.index(me)
        dst_boxes = {n: {me: dst.box(n, spec.shape, rank)} for n, spec in params.items()}
        dst_t = local_tensors(dst_module, dst_boxes, me, "destination")
    device = next(iter((src_t or dst_t).values())).device
    root = src.placement.workers[0]
    whole_root = _whole(params, device) if me == root else None
    first = move(gather, me, src_t, whole_root, timeout_s, first_tag)
    whole_dst = _whole(params, device) if me in broadcast.dst_workers else None
    second = move(broadcast, me, whole_root, whole_dst, timeout_s, first_tag + gather.n_tags)
    for name, t in dst_t.items():
        t.copy_(whole_dst[name][tuple(slice(lo, hi) for lo, hi in dst_boxes[name][me])])
    return ReallocStats(
        first.bytes_sent + second.bytes_sent,
        first.bytes_received + second.bytes_received,
        first.seconds + second.seconds,
    )
