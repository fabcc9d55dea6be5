"""Whether a layout can split a model's architecture: checked before any worker starts.

Tensor parallelism gives each rank whole attention heads (query and key/value) and an equal
slice of every MLP it splits: the dense MLP, each expert of a Mixture-of-Experts block and its
shared expert. Expert parallelism (an engine option) instead gives each rank an equal share of
whole experts, so the tensor-parallel size must divide the number of experts, not their size.
"""

from __future__ import annotations

from collections.abc import Mapping

from realrl.api.core.layout import Layout
from realrl.api.core.model_api import ReaLModelConfig


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]


def check_expert_parallel(cfg: ReaLModelConfig, tp: int, where: str) -> None:
    """A named error when expert parallelism over ``tp`` ranks cannot place this model's experts."""
    if not cfg.n_experts:
        raise ValueError(
            f"{where}: engine.expert_parallel=true places a Mixture-of-Experts model's experts on the "
            "tensor-parallel ranks, but this model has no experts (n_experts=0); leave it false"
        )
    if tp > 1 and cfg.n_experts % tp:
        raise ValueError(
            f"{where}: expert parallelism over m{tp} gives each rank n_experts/m whole experts, but "
            f"{cfg.n_experts} experts (n_experts) do not divide by {tp}; choose m among "
            f"{_divisors(cfg.n_experts)} or set engine.expert_parallel=false"
        )


def check_tensor_parallel(cfg: ReaLModelConfig, tp: int, where: str, expert_parallel: bool = False) -> None:
    """A named error when ``tp`` cannot split this architecture (``where``: the role / key);
    ``expert_parallel``: the role places whole experts on the tp ranks."""
    if expert_parallel:
        check_expert_parallel(cfg, tp, where)
    if tp == 1:
        return
    sizes = [
        ("query heads (n_q_heads)", cfg.n_q_heads),
        ("key/value heads (n_kv_heads)", cfg.n_kv_heads),
    ]
    if len(cfg.moe_layers) < cfg.n_layers:  # a dense block
        sizes.append(("MLP inner size (intermediate_dim)", cfg.intermediate_dim))
    if cfg.n_experts and not expert_parallel:
        sizes.append(("experts' inner size (moe_intermediate_dim)", cfg.moe_intermediate_dim))
    if cfg.shared_expert_intermediate_dim:
        sizes.append(
            (
                "shared expert's inner size (shared_expert_intermediate_dim)",
                cfg.shared_expert_intermediate_dim,
            )
        )
    for what, n in sizes:
        if n % tp:
            raise ValueError(
                f"{where}: tensor-parallel size m{tp} does not divide the model's {n} {what}; "
                f"choose m among {_divisors(n)}"
            )


def check_layouts(
    layouts: Mapping[str, list[Layout]],
    configs: Mapping[str, ReaLModelConfig | None],
    expert_parallel: Mapping[str, bool] | None = None,
) -> None:
    """Every layout of every role (its home and its calls' copies) against its architecture
    (``configs[role]``; None: not a ReaLModel); ``expert_parallel[role]``: its engine option."""
    for role, role_layouts in sorted(layouts.items()):
        cfg = configs.get(role)
        ep = bool((expert_parallel or {}).get(role, False))
        for layout in role_layouts if cfg is not None else ():
            check_tensor_parallel(cfg, layout.tp, f"model {role!r} in layout {layout}", ep)
            check_pipeline(cfg, layout.pp, f"model {role!r} in layout {layout}")


def check_pipeline(cfg: ReaLModelConfig, pp: int, where: str) -> None:
    """A named error when ``pp`` stages cannot hold this architecture: each stage needs a block."""
    if pp == 1:
        return
    if pp > cfg.n_layers:
        raise ValueError(
            f"{where}: {pp} pipeline stages need at least one block each, and the model has "
            f"{cfg.n_layers} (n_layers); choose p <= {cfg.n_layers}"
        )
