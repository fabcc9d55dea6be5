"""What the Mixture-of-Experts families share (mixtral, qwen2_moe, qwen3_moe): their attention is
llama-shaped (``_llama_like``), their sparse blocks' parameters map one to one onto ReaLModel's
(``_common.moe_param_names``).

Checkpoint files hold one tensor per expert and projection (Mixtral:
``block_sparse_moe.experts.{e}.w1/w3/w2`` for gate/up/down; Qwen:
``mlp.experts.{e}.gate_proj/up_proj/down_proj``): what transformers 5 writes, reverting its
in-memory fusion, and what earlier versions wrote. A state dict taken from a transformers 5 model
in memory holds the fused tensors instead (``mlp.experts.gate_up_proj`` [E, 2I, H] with the gate
rows first, ``mlp.experts.down_proj`` [E, H, I], and Mixtral's router as ``mlp.gate``); they are
read too, and split into the per-expert tensors. Saving always writes the per-expert form.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf._llama_like import TABLE, KeyMap

if TYPE_CHECKING:
    import torch

_FUSED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


@dataclasses.dataclass(frozen=True)
class MoENames:
    """How a family spells a sparse block in its checkpoints."""

    block: str  # the sparse block's module under model.layers.{i}: "block_sparse_moe" or "mlp"
    projections: tuple[str, str, str]  # an expert's gate, up and down projections
    shared_expert: bool = False  # Qwen2-MoE's shared_expert and shared_expert_gate

    def table(self) -> list[tuple[str, str]]:
        b, r = f"model.layers.{{i}}.{self.block}", "layers.{i}.mlp"
        rows = [(f"{b}.gate.weight", f"{r}.router.weight")]
        if self.block != "mlp":  # transformers' in-memory name of the router (read only)
            rows.append(("model.layers.{i}.mlp.gate.weight", f"{r}.router.weight"))
        rows += [
            (f"{b}.experts.{{e}}.{hf}.weight", f"{r}.experts.{{e}}.{real}.weight")
            for real, hf in zip(("gate", "up", "down"), self.projections)
        ]
        if self.shared_expert:
            rows += [
                (f"{b}.shared_expert.{x}_proj.weight", f"{r}.shared.{x}.weight")
                for x in ("gate", "up", "down")
            ]
            rows.append((f"{b}.shared_expert_gate.weight", f"{r}.shared_gate.weight"))
        return rows

    def unfuse(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``sd`` with transformers' fused in-memory expert tensors split into per-expert ones."""
        out = {}
        gate, up, down = self.projections
        for key, t in sd.items():
            m = _FUSED.match(key)
            if m is None:
                out[key] = t
                continue
            prefix = f"model.layers.{m.group(1)}.{self.block}.experts"
            for e in range(t.shape[0]):
                if m.group(2) == "down_proj":
                    out[f"{prefix}.{e}.{down}.weight"] = t[e]
                else:  # [gate; up] rows
                    half = t.shape[1] // 2
                    out[f"{prefix}.{e}.{gate}.weight"] = t[e, :half]
                    out[f"{prefix}.{e}.{up}.weight"] = t[e, half:]
        return out


class MoEKeyMap:
    """The state-dict converters of a family: its sparse blocks' rows before the llama table."""

    def __init__(self, names: MoENames, family: str):
        self.names = names
        self.keys = KeyMap(names.table() + TABLE, family)

    def sd_from_hf(self, sd: dict[str, torch.Tensor], cfg: ReaLModelConfig) -> dict[str, torch.Tensor]:
        return self.keys.sd_from_hf(self.names.unfuse(sd), cfg)

    def sd_to_hf(self, sd: dict[str, torch.Tensor], cfg: ReaLModelConfig) -> dict[str, torch.Tensor]:
        return self.keys.sd_to_hf(sd, cfg)


def first_of(hf: Any, names: tuple[str, ...], default: Any) -> Any:
    """The first of ``names`` the config holds (families spell the expert count two ways:
    ``num_experts`` and ``num_local_experts``), else ``default``."""
    for name in names:
        value = getattr(hf, name, None)
        if value is not None:
            return value
    return default


def moe_fields(hf: Any, n_experts: int, moe_intermediate: int, **fields: Any) -> dict[str, Any]:
    """The ReaLModelConfig fields of the experts every family reads alike."""
    return dict(
        n_experts=int(n_experts),
        n_experts_per_tok=int(hf.num_experts_per_tok),
        moe_intermediate_dim=int(moe_intermediate),
        router_aux_loss_coef=float(hf.router_aux_loss_coef),
        **fields,
    )


def qwen_moe_hf_fields(cfg: ReaLModelConfig) -> dict[str, Any]:
    """The Mixture-of-Experts keys Qwen2-MoE's and Qwen3-MoE's ``config.json`` share."""
    return dict(
        num_experts=cfg.n_experts,
        num_experts_per_tok=cfg.n_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_dim or cfg.intermediate_dim,
        norm_topk_prob=cfg.norm_topk_prob,
        decoder_sparse_step=cfg.decoder_sparse_step,
        mlp_only_layers=list(cfg.mlp_only_layers),
        router_aux_loss_coef=cfg.router_aux_loss_coef,
    )
