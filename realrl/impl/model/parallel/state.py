"""Parallel models' state: whole weights for HF checkpoints, sharded state for recover points.

A Hugging Face checkpoint is one ordinary folder, so its weights are gathered whole (one
parameter at a time, collective over the parameter's mesh) and written by one rank. A recover
point keeps each rank's shards of the weights and the optimizer state with
``torch.distributed.checkpoint`` (DCP): every rank writes its own part, nothing is gathered, and
loading with the same layout restores every bit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from realrl.impl.model.parallel.dtensor import is_dtensor


def full_state_dict(module: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """Whole CPU tensors of ``module``'s state dict; empty where ``keep`` is False (the ranks that
    do not write: they take part in the gathers and drop each tensor at once). Under expert
    parallelism each rank's state dict holds its own experts only: every expert is gathered."""
    from realrl.impl.model.parallel.expert_parallel import gather_experts, placed_whole

    elsewhere = tuple(f"{prefix}.experts." for prefix, _ in placed_whole(module))
    out = {}
    for name, value in module.state_dict().items():
        if elsewhere and name.startswith(elsewhere):  # gathered below, expert by expert
            continue
        whole = value.full_tensor() if is_dtensor(value) else value
        if keep:
            out[name] = whole.detach().cpu().contiguous()
    out.update(gather_experts(module, keep))
    return out


# the optimizer's state and hyperparameters keyed by parameter name, not by group index: ranks
# that hold different parameters (pipeline stages) would otherwise write the same keys
# ("param_groups.0.params"), which DCP saves once, as if every rank held the same
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def sharded_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """This rank's shards of the weights (and optimizer state), as DCP saves and loads them."""
    if optimizer is None:
        model_sd = get_state_dict(module, [], options=_OPTIONS)[0]
        return {"model": model_sd}
    model_sd, optim_sd = get_state_dict(module, optimizer, options=_OPTIONS)
    return {"model": model_sd, "optim": optim_sd}


def save_sharded(path: str, state: dict[str, Any], group: dist.ProcessGroup | None) -> None:
    dcp.save(state, checkpoint_id=path, process_group=group)


def load_sharded(
    path: str,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    group: dist.ProcessGroup | None,
) -> None:
    state = sharded_state(module, optimizer)
    dcp.load(state, checkpoint_id=path, process_group=group)
    if optimizer is None:
        set_state_dict(module, [], model_state_dict=state["model"], optim_state_dict={}, options=_OPTIONS)
    else:
        set_state_dict(
            module,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=_OPTIONS,
        )
