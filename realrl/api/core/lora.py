"""The options of LoRA adapters (``<role>.lora.*``) and what they cost: the command line, the
config checks and the memory plan read them; ``realrl.impl.model.nn.lora`` builds them on a
model with peft."""

from __future__ import annotations

import dataclasses
from typing import Any

from realrl.api.core.model_api import ReaLModelConfig

# ReaLModel's linear modules, and the Hugging Face (llama-family) names users may write instead
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
HF_NAMES = {f"{p}_proj": p for p in PROJECTIONS}


@dataclasses.dataclass
class LoRAConfig:
    """``<role>.lora.*``: rank 0 trains the whole model; rank r > 0 trains adapters of rank r on
    ``target_modules`` (and a critic's value head) and freezes the rest."""

    rank: int = 0
    alpha: float = 16.0  # the update is scaled by alpha / rank
    dropout: float = 0.0  # on the adapters' input
    target_modules: list[str] = dataclasses.field(default_factory=lambda: list(PROJECTIONS))

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"lora.rank must be >= 0 (0: no adapters), got {self.rank}")
        if self.rank == 0:
            return
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError(f"lora.target_modules is empty; choose among {list(PROJECTIONS)}")
        unknown = [m for m in self.target_modules if HF_NAMES.get(m, m) not in PROJECTIONS]
        if unknown:
            raise ValueError(
                f"lora.target_modules: {unknown} name no linear module of the model; choose among "
                f"{list(PROJECTIONS)} (or their Hugging Face names {list(HF_NAMES)})"
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def modules(self) -> list[str]:
        """The targets in ReaLModel's names, in a fixed order."""
        wanted = {HF_NAMES.get(m, m) for m in self.target_modules}
        return [p for p in PROJECTIONS if p in wanted]


def lora_of(args: dict[str, Any] | None) -> LoRAConfig | None:
    """The enabled ``LoRAConfig`` of a model's factory arguments (``"lora"``), else None."""
    raw = (args or {}).get("lora")
    if raw is None:
        return None
    cfg = raw if isinstance(raw, LoRAConfig) else LoRAConfig(**raw)
    return cfg if cfg.enabled else None


def adapter_param_count(cfg: ReaLModelConfig, lora: LoRAConfig, expert_shards: int = 1) -> int:
    """Parameters of ``lora``'s adapters on a model of ``cfg``: rank x (in + out) per adapted
    linear (never split by tensor parallelism). A Mixture-of-Experts block's gate / up / down are
    those of each expert and of its shared expert (peft matches the module names), none on the
    router; ``expert_shards``: ranks that share the experts out whole (expert parallelism), each
    holding the adapters of ``n_experts / expert_shards`` of them."""
    h, q, kv = cfg.hidden_dim, cfg.n_q_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    attention = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h)}
    wanted = lora.modules()

    def mlp(inner: int) -> int:
        shapes = {"gate": (h, inner), "up": (h, inner), "down": (inner, h)}
        if cfg.mlp_type != "gated":
            shapes.pop("gate")
        return sum(lora.rank * sum(shapes[m]) for m in wanted if m in shapes)

    per_attention = sum(lora.rank * sum(attention[m]) for m in wanted if m in attention)
    total = 0
    for i in range(cfg.n_layers):
        if not cfg.is_moe_layer(i):
            total += per_attention + mlp(cfg.intermediate_dim)
            continue
        experts = -(-cfg.n_experts // expert_shards)
        shared = mlp(cfg.shared_expert_intermediate_dim) if cfg.shared_expert_intermediate_dim else 0
        total += per_attention + experts * mlp(cfg.moe_intermediate_dim) + shared
    return total
