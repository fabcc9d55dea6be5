"""Make a whole module parallel as its layout says: tensor parallelism over "tp" (with expert
parallelism for a Mixture-of-Experts model when asked), then FSDP2 over "dp" when the engine
shards training state. Every rank holds the same whole module before (same seed or same
checkpoint), or its tensor-parallel part of a checkpoint loaded split; each keeps its part after."""

from __future__ import annotations

import torch
from torch import nn

from realrl.impl.model.parallel.dtensor import is_dtensor
from realrl.impl.model.parallel.mesh import ParallelContext


def parallelize(
    module: nn.Module, parallel: ParallelContext | None, fsdp_param_dtype: torch.dtype | None = None
) -> None:
    """``fsdp_param_dtype``: the dtype FSDP2 gathers and computes in (``apply_fsdp``; None: the
    module's own), which the backend decides."""
    if parallel is None or parallel.mesh is None:
        return
    tp, ep = parallel.layout.tp, parallel.expert_parallel
    if ep:
        from realrl.api.core.layout_fit import check_expert_parallel

        check_expert_parallel(module.config, tp, f"layout {parallel.layout}")
    if tp > 1:
        from realrl.impl.model.parallel.expert_parallel import gather_own_experts, placed_whole

        if not any(is_dtensor(p) for p in module.parameters()):  # not loaded split
            from realrl.impl.model.parallel.tensor_parallel import apply_tensor_parallel

            apply_tensor_parallel(module, parallel.tp_mesh, ep)
        elif ep and not placed_whole(module):  # loaded split by tensor parallelism alone
            gather_own_experts(module, parallel.tp_mesh)
        elif placed_whole(module) and not ep:
            raise ValueError(
                f"layout {parallel.layout}: the model was loaded with whole experts per rank (expert "
                "parallelism), but its engine does not ask for expert_parallel"
            )
    if parallel.fsdp and parallel.layout.dp > 1:
        from realrl.impl.model.parallel.fsdp import apply_fsdp

        apply_fsdp(module, parallel.dp_mesh, fsdp_param_dtype)
