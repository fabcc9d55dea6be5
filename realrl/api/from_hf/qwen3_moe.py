"""Qwen3-MoE: qwen3-shaped attention (per-head q/k RMSNorm, one bias switch for q/k/v/o) and
routed experts without a shared one; blocks may be dense (``decoder_sparse_step``,
``mlp_only_layers``)."""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf import _common, _llama_like, _moe

# transformers' Qwen3MoeConfig defaults for what config_from_hf reads (no head_dim of its own:
# hidden_size // num_attention_heads unless the file sets one)
DEFAULTS = {
    **_common.LLAMA_LIKE_DEFAULTS,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 768,
    "num_experts_per_tok": 8,
    "norm_topk_prob": False,
    "router_aux_loss_coef": 0.001,
    "mlp_only_layers": None,
}
N_EXPERTS_DEFAULT = 128
KEYS = _moe.MoEKeyMap(_moe.MoENames("mlp", ("gate_proj", "up_proj", "down_proj")), "qwen3_moe")


def config_from_hf(hf: Any) -> ReaLModelConfig:
    hf = _common.HFConfig(hf, DEFAULTS)
    n_experts = _moe.first_of(hf, ("num_experts", "num_local_experts"), N_EXPERTS_DEFAULT)
    return _llama_like.config_from_hf(
        hf,
        qk_layernorm=True,
        use_mlp_bias=False,
        sliding_window=hf.sliding_window if hf.use_sliding_window else None,
        **_moe.moe_fields(
            hf,
            n_experts,
            hf.moe_intermediate_size,
            norm_topk_prob=bool(hf.norm_topk_prob),
            decoder_sparse_step=int(hf.decoder_sparse_step),
            mlp_only_layers=tuple(hf.mlp_only_layers or ()),
        ),
    )


def config_to_hf(cfg: ReaLModelConfig) -> dict[str, Any]:
    _llama_like.check_llama_shape(cfg, "qwen3_moe")
    if not cfg.qk_layernorm or cfg.use_attention_bias != cfg.use_attn_proj_bias:
        raise ValueError("qwen3_moe: needs q/k layernorm and the same bias on q/k/v and o")
    if cfg.shared_expert_intermediate_dim:
        raise ValueError("qwen3_moe: cannot express a shared expert (qwen2_moe can)")
    window = cfg.sliding_window
    return _llama_like.config_to_hf(
        cfg,
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        attention_bias=cfg.use_attention_bias,
        use_sliding_window=bool(window),
        **(dict(sliding_window=window) if window else {}),
        **_moe.qwen_moe_hf_fields(cfg),
    )


_llama_like.register_llama_like("qwen3_moe", config_from_hf, config_to_hf, KEYS)
