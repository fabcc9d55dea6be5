"""Qwen3: llama-shaped with RMSNorm on each head's queries and keys (before rotary)."""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf import _common, _llama_like
from realrl.api.from_hf._sliding import uniform_sliding_window

# transformers' Qwen3Config defaults for what config_from_hf reads
DEFAULTS = {
    **_common.LLAMA_LIKE_DEFAULTS,
    "num_key_value_heads": 32,
    "max_position_embeddings": 32768,
    "head_dim": 128,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "layer_types": None,
}


def config_from_hf(hf: Any) -> ReaLModelConfig:
    hf = _common.HFConfig(hf, DEFAULTS)
    return _llama_like.config_from_hf(
        hf, qk_layernorm=True, use_mlp_bias=False, sliding_window=uniform_sliding_window(hf, "qwen3")
    )


def config_to_hf(cfg: ReaLModelConfig) -> dict[str, Any]:
    _llama_like.check_llama_shape(cfg, "qwen3")
    if not cfg.qk_layernorm or cfg.use_mlp_bias or cfg.use_attention_bias != cfg.use_attn_proj_bias:
        raise ValueError("qwen3: needs q/k layernorm, no MLP bias, and the same bias on q/k/v and o")
    window = dict(use_sliding_window=True, sliding_window=cfg.sliding_window, max_window_layers=0)
    return _llama_like.config_to_hf(
        cfg,
        "qwen3",
        "Qwen3ForCausalLM",
        attention_bias=cfg.use_attention_bias,
        **(window if cfg.sliding_window else dict(use_sliding_window=False)),
    )


_llama_like.register_llama_like("qwen3", config_from_hf, config_to_hf)
