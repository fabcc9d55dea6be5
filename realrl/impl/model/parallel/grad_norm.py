"""Global gradient-norm clipping over sharded and whole gradients.

A DTensor gradient's squares are summed locally and then over each mesh dimension it is sharded
on; a replicated one (or a plain tensor, whole on every rank) is counted once. A parameter that
one tp rank holds alone, whole (expert parallelism: each rank's own experts; a plain tensor, or
FSDP's shard of one over "dp"), is also summed over the tp group. Which parameters those are is
read from the module when the norm is taken (``own_parts``), not marked on the parameters at
split time: what wraps the module afterwards (FSDP2, the engine's moves and casts) replaces
them. Every rank of the model runs the same reductions in the same order, so the norm is the
same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

from realrl.impl.model.parallel.dtensor import is_dtensor, local
from realrl.impl.model.parallel.mesh import comm_device


def total_norm(
    grads: Iterable[tuple[torch.Tensor, dist.ProcessGroup | None]], across: dist.ProcessGroup | None = None
) -> float:
    """The norm of (gradient, group its rank's part is summed over or None) pairs; ``across``: the
    squares are then summed over that group too (the pipeline stages, each holding other layers)."""
    sums: dict[tuple, torch.Tensor] = {}
    groups: dict[tuple, list[dist.ProcessGroup]] = {}
    for g, own in grads:
        key: tuple = () if own is None else (id(own),)
        members = [] if own is None else [own]
        if is_dtensor(g):
            dims = tuple(i for i, p in enumerate(g.placements) if not p.is_replicate())  # strided too
            key += (id(g.device_mesh), dims)
            members = [g.device_mesh.get_group(d) for d in dims] + members
        groups.setdefault(key, members)
        sq = local(g).detach().float().pow(2).sum()
        sums[key] = sums[key] + sq if key in sums else sq
    total = 0.0
    for key, s in sums.items():
        s = s.to(torch.float64)
        for group in groups[key]:
            s = s.to(comm_device(group))
            dist.all_reduce(s, group=group)
        total += float(s)
    if across is not None:
        t = torch.tensor([total], dtype=torch.float64, device=comm_device(across))
        dist.all_reduce(t, group=across)
        total = float(t)
    return math.sqrt(total)


def clip_grad_norm(
    params: list[torch.nn.Parameter],
    max_norm: float,
    module: torch.nn.Module | None = None,
    across: dist.ProcessGroup | None = None,
    uncounted: set[int] = frozenset(),
) -> float:
    """Scale the gradients so their global norm is at most ``max_norm``; return the norm before.
    ``module``: the model ``params`` belong to, when some of them may be one rank's own.
    ``across``: other ranks hold the rest of the model (pipeline stages); ``uncounted``: ids of
    parameters clipped but left out of the norm (a second copy of a tied weight)."""
    from realrl.impl.model.parallel.expert_parallel import own_parts

    own = own_parts(module) if module is not None else {}
    with_grad = [p for p in params if p.grad is not None]
    grads = [p.grad for p in with_grad]
    counted = [p for p in with_grad if id(p) not in uncounted]
    norm = total_norm(((p.grad, own.get(id(p))) for p in counted), across)
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0 and math.isfinite(norm):
        with torch.no_grad():
            torch._foreach_mul_([local(g) for g in grads], coef)
    return norm
