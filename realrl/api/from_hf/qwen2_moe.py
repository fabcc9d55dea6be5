"""Qwen2-MoE: qwen2-shaped attention (q/k/v biases, none on o) and, in its sparse blocks, routed
experts plus a shared expert scaled by a sigmoid gate; the other blocks are dense
(``decoder_sparse_step``, ``mlp_only_layers``)."""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf import _common, _llama_like, _moe
from realrl.api.from_hf._sliding import uniform_window

# transformers' Qwen2MoeConfig defaults for what config_from_hf reads
DEFAULTS = {
    **_common.LLAMA_LIKE_DEFAULTS,
    "num_key_value_heads": 16,
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "layer_types": None,
    "qkv_bias": True,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4,
    "norm_topk_prob": False,
    "router_aux_loss_coef": 0.001,
    "mlp_only_layers": None,
}
N_EXPERTS_DEFAULT = 60
KEYS = _moe.MoEKeyMap(
    _moe.MoENames("mlp", ("gate_proj", "up_proj", "down_proj"), shared_expert=True), "qwen2_moe"
)


def sliding_window(hf: Any) -> int | None:
    """Qwen2MoeConfig's layer types when the file lists none: every other layer (0, 2, ...) below
    ``max_window_layers`` slides; only a uniform layout is supported."""
    window = hf.sliding_window if hf.use_sliding_window else None
    types = hf.layer_types or [
        "sliding_attention" if (i + 1) % 2 and i < hf.max_window_layers and window else "full_attention"
        for i in range(hf.num_hidden_layers)
    ]
    return uniform_window(window, types, "qwen2_moe")


def config_from_hf(hf: Any) -> ReaLModelConfig:
    hf = _common.HFConfig(hf, DEFAULTS)
    n_experts = int(_moe.first_of(hf, ("num_experts", "num_local_experts"), N_EXPERTS_DEFAULT))
    return _llama_like.config_from_hf(
        hf,
        use_attention_bias=bool(hf.qkv_bias),
        use_attn_proj_bias=False,
        use_mlp_bias=False,
        sliding_window=sliding_window(hf),
        **_moe.moe_fields(
            hf,
            n_experts,
            hf.moe_intermediate_size,
            norm_topk_prob=bool(hf.norm_topk_prob),
            # transformers builds the shared expert in sparse blocks only
            shared_expert_intermediate_dim=int(hf.shared_expert_intermediate_size) if n_experts else 0,
            decoder_sparse_step=int(hf.decoder_sparse_step),
            mlp_only_layers=tuple(hf.mlp_only_layers or ()),
        ),
    )


def config_to_hf(cfg: ReaLModelConfig) -> dict[str, Any]:
    _llama_like.check_llama_shape(cfg, "qwen2_moe")
    if cfg.use_attn_proj_bias or cfg.qk_layernorm:
        raise ValueError("qwen2_moe: cannot express an o-projection bias or q/k layernorm")
    window = cfg.sliding_window
    return _llama_like.config_to_hf(
        cfg,
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        qkv_bias=cfg.use_attention_bias,
        use_sliding_window=bool(window),
        **(dict(sliding_window=window, layer_types=["sliding_attention"] * cfg.n_layers) if window else {}),
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_dim,
        **_moe.qwen_moe_hf_fields(cfg),
    )


_llama_like.register_llama_like("qwen2_moe", config_from_hf, config_to_hf, KEYS)
