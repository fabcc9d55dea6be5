"""Expert parallelism over the tp ranks: each sparse block keeps an equal, contiguous share of its
experts whole (``tensor_parallel.expert_range``), everything else is split as by tensor
parallelism (``nn/moe.py`` says why no all-to-all is needed).

What it takes besides the split itself (``apply_tensor_parallel(..., expert_parallel=True)``):
a model that arrived split by tensor parallelism (a checkpoint loaded split without the option)
gathers its own experts whole; the global gradient norm adds every rank's own experts
(``own_parts``); a Hugging Face checkpoint gathers every expert.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.device_mesh import DeviceMesh

from realrl.impl.model.nn.moe import ExpertSplit, MoE, routed_expert
from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.mesh import comm_device
from realrl.impl.model.parallel.tensor_parallel import expert_range


def sparse_blocks(model: nn.Module) -> Iterator[tuple[str, MoE]]:
    """(name, block) of every Mixture-of-Experts block of ``model``, under the model's own names
    (as its state dict has them: without a checkpoint wrapper's prefix)."""
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            yield name.replace(_CHECKPOINT_PREFIX, ""), module


def placed_whole(model: nn.Module) -> list[tuple[str, MoE]]:
    """The sparse blocks of ``model`` that hold whole experts over tp ranks (expert parallelism)."""
    return [(n, moe) for n, moe in sparse_blocks(model) if moe.split is not None and moe.split.whole_experts]


@torch.no_grad()
def gather_own_experts(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Turn the experts of a model split by tensor parallelism into expert parallelism: every
    expert is gathered whole (collective over ``tp_mesh``, one expert at a time), and each rank
    keeps its own share as plain modules."""
    cfg = model.config
    held = expert_range(cfg.n_experts, tp_mesh.size(), tp_mesh.get_local_rank())
    for _, moe in sparse_blocks(model):
        for e in range(moe.n_experts):
            split = moe.experts[str(e)]
            whole = {n: p.full_tensor() if is_dtensor(p) else p for n, p in split.named_parameters()}
            if e in held:
                like = next(iter(whole.values()))
                fresh = routed_expert(cfg, dtype=like.dtype, device=like.device)
                fresh.load_state_dict(whole)
                moe.experts[str(e)] = fresh
        moe.keep_experts(held)
        moe.split = ExpertSplit(moe.split.group, whole_experts=True)


def own_parts(model: nn.Module) -> dict[int, dist.ProcessGroup]:
    """id of each parameter in ``model`` now that only one tp rank holds (its own experts) ->
    that tp group: the global gradient norm sums their squares over it."""
    return {id(p): moe.split.group for _, moe in placed_whole(model) for p in moe.experts.parameters()}


def gather_experts(model: nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """Every expert of the blocks that hold whole experts per rank, whole, as CPU tensors under
    their state-dict names (empty where ``keep`` is False). Collective over each block's tp
    group: expert by expert, its owner broadcasts it (gathered over "dp" first under FSDP)."""
    out = {}
    for prefix, moe in placed_whole(model):
        group = moe.split.group
        ranks = dist.get_process_group_ranks(group)
        device = comm_device(group)
        shapes = [(n, p.shape, p.dtype) for n, p in next(iter(moe.experts.values())).named_parameters()]
        for e in range(moe.n_experts):
            for name, shape, dtype in shapes:
                if e in moe.held:
                    value = moe.experts[str(e)].get_parameter(name)
                    value = (value.full_tensor() if is_dtensor(value) else value).detach()
                    value = value.to(device, copy=True).contiguous()
                else:
                    value = torch.empty(shape, dtype=dtype, device=device)
                dist.broadcast(value, src=ranks[e // len(moe.held)], group=group)
                if keep:
                    out[f"{prefix}.experts.{e}.{name}"] = value.cpu()
    return out
