"""Make a whole module parallel as its layout says: tensor parallelism over "tp", then FSDP2
over "dp" when the engine shards training state. Every rank holds the same whole module before
(same seed or same checkpoint); each keeps its part after."""

from __future__ import annotations

from torch import nn

from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.mesh import ParallelContext


def parallelize(module: nn.Module, parallel: ParallelContext | None) -> None:
    if parallel is None or parallel.mesh is None:
        return
    if parallel.layout.tp > 1 and not any(is_dtensor(p) for p in module.parameters()):  # not loaded split
        from realrl.impl.model.parallel.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(module, parallel.tp_mesh)
    if parallel.fsdp and parallel.layout.dp > 1:
        from realrl.impl.model.parallel.fsdp import apply_fsdp

        apply_fsdp(module, parallel.dp_mesh)
