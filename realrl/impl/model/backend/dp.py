"""Data parallelism over a torch.distributed process group (gloo on CPU, NCCL on GPU).

The engines do not wrap modules in DDP: gradients are accumulated over micro-batches locally and
summed across ranks once per update, in flat buckets. Loss scaling (see ``train_engine``) makes
that sum the gradient of the global batch's loss.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from realrl.impl.model.parallel.dtensor import local
from realrl.impl.model.parallel.mesh import comm_device

BUCKET_BYTES = 32 * 1024 * 1024


def world_size(group: dist.ProcessGroup | None) -> int:
    """Ranks in ``group``; ``None`` means no data parallelism (one process)."""
    if group is None:
        return 1
    if not dist.is_initialized():
        raise RuntimeError("a data-parallel group was given but torch.distributed is not initialized")
    return dist.get_world_size(group)


def rank(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else dist.get_rank(group)


def all_reduce_sum(value: float, group: dist.ProcessGroup | None) -> float:
    """Sum a Python number over the group (float64, so token counts stay exact).

    Control reductions of Python numbers go through host memory, over gloo (every group has it:
    "gloo" or "cpu:gloo,cuda:nccl"): no copy to a GPU and back, no wait on its stream."""
    if world_size(group) == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return float(t.item())


def all_reduce_max(value: int, group: dist.ProcessGroup | None) -> int:
    """The largest of an integer over the group (how many micro-batches every rank must run)."""
    if world_size(group) == 1:
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64)  # over gloo, as all_reduce_sum
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def all_reduce_gradients(params: Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None) -> None:
    """Sum every trainable parameter's gradient over the group, in place.

    A parameter without a gradient on this rank gets zeros, so every rank sends the same buckets
    (otherwise a rank that skipped a parameter would deadlock the others). A tensor-parallel
    gradient (DTensor) is summed shard by shard: every replica splits it the same way.
    """
    if world_size(group) == 1:
        return
    grads = []
    for p in params:
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(local(p.grad))
    buckets: list[list[torch.Tensor]] = []
    size, key = 0, None
    for g in grads:
        k = (g.dtype, g.device)
        nbytes = g.numel() * g.element_size()
        if not buckets or k != key or size + nbytes > BUCKET_BYTES:
            buckets.append([])
            size, key = 0, k
        buckets[-1].append(g)
        size += nbytes
    target = comm_device(group)
    for bucket in buckets:
        flat = _flatten_dense_tensors(bucket)
        moved = flat.to(target)  # CUDA gradients over a gloo-only group (workers sharing a GPU)
        dist.all_reduce(moved, op=dist.ReduceOp.SUM, group=group)
        if moved is not flat:
            flat.copy_(moved)
        for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            g.copy_(synced)


def barrier(group: dist.ProcessGroup | None) -> None:
    if world_size(group) > 1:
        dist.barrier(group=group)
