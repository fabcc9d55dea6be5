"""Llama (and Llama-3 rope scaling): RMSNorm, gated SiLU MLP, rotary, GQA, optional biases."""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf import _common, _llama_like

# transformers' LlamaConfig defaults for what config_from_hf reads
DEFAULTS = {**_common.LLAMA_LIKE_DEFAULTS, "bos_token_id": 1, "eos_token_id": 2}


def config_from_hf(hf: Any) -> ReaLModelConfig:
    return _llama_like.config_from_hf(_common.HFConfig(hf, DEFAULTS))


def config_to_hf(cfg: ReaLModelConfig) -> dict[str, Any]:
    _llama_like.check_llama_shape(cfg, "llama")
    if cfg.qk_layernorm or cfg.sliding_window or cfg.use_attention_bias != cfg.use_attn_proj_bias:
        raise ValueError(
            "llama: cannot express q/k layernorm, a sliding window, or q/k/v biases without an o bias"
        )
    return _llama_like.config_to_hf(
        cfg, "llama", "LlamaForCausalLM", attention_bias=cfg.use_attention_bias, mlp_bias=cfg.use_mlp_bias
    )


_llama_like.register_llama_like("llama", config_from_hf, config_to_hf)
