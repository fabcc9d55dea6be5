"""Sharded training with FSDP2: each transformer block is one unit (its parameters are gathered
for its forward and backward and freed after), the embedding, final norm and head another.

Composed with tensor parallelism on the ("dp", "tp") mesh: FSDP shards over "dp" the DTensors
the tensor-parallel plan made over "tp".
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def is_fsdp(model: nn.Module) -> bool:
    """Whether FSDP manages ``model`` or any module in it, inside ``gathered`` too (the weights
    are whole there, but FSDP's hooks still run around every unit's forward). Free where FSDP was
    never imported: such a process holds no FSDP module."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and any(isinstance(m, fsdp.FSDPModule) for m in model.modules())


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, param_dtype: torch.dtype | None = None) -> None:
    """Shard ``model`` (on its device, whole on every rank) over ``dp_mesh`` in place.

    ``param_dtype`` (a train engine's bf16 or fp16; None otherwise): every unit keeps fp32 shards
    (the optimizer's master weights) but gathers and computes in that dtype and reduce-scatters
    its gradients in fp32 into fp32 sharded gradients (FSDP2's ``MixedPrecisionPolicy``, as
    torchtitan and verl train): half the all-gather traffic and gathered-weights memory of an fp32
    gather. Without it FSDP2 gathers in the dtype the module has at its first forward through the
    root (its lazy initialisation), so the engine first casts the module to its own dtype, then
    calls ``settle_root``; nothing runs through the module here.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from realrl.impl.model.parallel.tensor_parallel import numbered_blocks

    low = param_dtype is not None and param_dtype != torch.float32
    # else FSDP2's default policy: the module's own dtype throughout
    policy = MixedPrecisionPolicy(param_dtype, reduce_dtype=torch.float32) if low else MixedPrecisionPolicy()
    for _, layer in numbered_blocks(model):
        fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def settle_root(model: nn.Module) -> None:
    """One token through ``model``, an FSDP2 root (a collective over its dp ranks), in the dtype
    it has now. FSDP2 settles which unit is the root, and the dtype it gathers weights in, at the
    first forward it sees; generation calls the blocks without the root's forward, so the engine
    runs this once the module is on its device and in its dtype. The root keeps its weights
    gathered after a forward; they are sharded again after this one."""
    if hasattr(model, "dry_run"):  # a pipeline stage: its own first forward
        model.dry_run()
    else:
        device = next(model.parameters()).device
        with torch.no_grad():
            model(
                torch.zeros(1, dtype=torch.long, device=device),
                torch.tensor([0, 1], dtype=torch.int32, device=device),
            )
    model.reshard()


def sum_gradients(model: nn.Module) -> None:
    """Reduce-scatter gradients as a sum over the dp ranks, not FSDP's default mean: the train
    engine scales each rank's loss by the global loss weight, so the sum is the batch gradient."""
    from torch.distributed.fsdp import FSDPModule

    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no pre-scaled sum


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """Every FSDP unit's parameters whole for the duration (generation: a decoding step runs every
    block once per token, and the loop reads the embedding and head outside ``forward``)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(True)
            unit.reshard()
