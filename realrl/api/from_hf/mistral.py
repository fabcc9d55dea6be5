"""Mistral: llama-shaped, no biases, a sliding attention window."""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf import _common, _llama_like

# transformers' MistralConfig defaults for what config_from_hf reads
DEFAULTS = {
    **_common.LLAMA_LIKE_DEFAULTS,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096 * 32,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "sliding_window": 4096,
}


def config_from_hf(hf: Any) -> ReaLModelConfig:
    hf = _common.HFConfig(hf, DEFAULTS)
    return _llama_like.config_from_hf(
        hf,
        sliding_window=getattr(hf, "sliding_window", None),
        use_attention_bias=False,
        use_attn_proj_bias=False,
    )


def config_to_hf(cfg: ReaLModelConfig) -> dict[str, Any]:
    _llama_like.check_llama_shape(cfg, "mistral")
    if cfg.qk_layernorm or cfg.use_attention_bias or cfg.use_attn_proj_bias or cfg.use_mlp_bias:
        raise ValueError("mistral: cannot express biases or q/k layernorm")
    return _llama_like.config_to_hf(cfg, "mistral", "MistralForCausalLM", sliding_window=cfg.sliding_window)


_llama_like.register_llama_like("mistral", config_from_hf, config_to_hf)
