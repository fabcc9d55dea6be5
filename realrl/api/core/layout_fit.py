"""Whether a layout can split a model's architecture: checked before any worker starts.

Tensor parallelism gives each rank whole attention heads (query and key/value) and an equal
slice of the MLP, so the tensor-parallel size must divide all three.
"""

from __future__ import annotations

from collections.abc import Mapping

from realrl.api.core.layout import Layout
from realrl.api.core.model_api import ReaLModelConfig


def check_tensor_parallel(cfg: ReaLModelConfig, tp: int, where: str) -> None:
    """A named error when ``tp`` cannot split this architecture (``where``: the role / key)."""
    if tp == 1:
        return
    if cfg.n_experts:
        raise ValueError(
            f"{where}: tensor-parallel size m{tp}: Mixture-of-Experts models are not split by tensor "
            "parallelism yet; use data parallelism (d) or FSDP"
        )
    for what, n in (
        ("query heads (n_q_heads)", cfg.n_q_heads),
        ("key/value heads (n_kv_heads)", cfg.n_kv_heads),
        ("MLP inner size (intermediate_dim)", cfg.intermediate_dim),
    ):
        if n % tp:
            fits = [d for d in range(1, min(n, 64) + 1) if n % d == 0]
            raise ValueError(
                f"{where}: tensor-parallel size m{tp} does not divide the model's {n} {what}; choose m among {fits}"
            )


def check_layouts(layouts: Mapping[str, list[Layout]], configs: Mapping[str, ReaLModelConfig | None]) -> None:
    """Every layout of every role (its home and its calls' copies) against its architecture
    (``configs[role]``; None: not a ReaLModel)."""
    for role, role_layouts in sorted(layouts.items()):
        cfg = configs.get(role)
        for layout in role_layouts if cfg is not None else ():
            check_tensor_parallel(cfg, layout.tp, f"model {role!r} in layout {layout}")
