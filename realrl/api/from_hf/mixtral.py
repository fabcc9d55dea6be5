"""Mixtral: mistral-shaped attention (no biases, optional sliding window) and a Mixture of Experts
in every block: top-k routing whose weights are always renormalised, no shared expert."""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf import _common, _llama_like, _moe

# transformers' MixtralConfig defaults for what config_from_hf reads (its rope_theta: 1e6)
DEFAULTS = {
    **_common.LLAMA_LIKE_DEFAULTS,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "sliding_window": None,
    "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0,
}
N_EXPERTS_DEFAULT = 8
KEYS = _moe.MoEKeyMap(_moe.MoENames("block_sparse_moe", ("w1", "w3", "w2")), "mixtral")


def config_from_hf(hf: Any) -> ReaLModelConfig:
    hf = _common.HFConfig(hf, DEFAULTS)
    if float(hf.router_jitter_noise or 0.0):
        raise ValueError(
            f"mixtral: router_jitter_noise={hf.router_jitter_noise} (noise on the router's input in "
            "training) is not supported; set it to 0.0 in config.json"
        )
    n_experts = _moe.first_of(hf, ("num_local_experts", "num_experts"), N_EXPERTS_DEFAULT)
    return _llama_like.config_from_hf(
        hf,
        sliding_window=hf.sliding_window,
        use_attention_bias=False,
        use_attn_proj_bias=False,
        use_mlp_bias=False,
        **_moe.moe_fields(hf, n_experts, hf.intermediate_size, norm_topk_prob=True),
    )


def config_to_hf(cfg: ReaLModelConfig) -> dict[str, Any]:
    _llama_like.check_llama_shape(cfg, "mixtral")
    if cfg.qk_layernorm or cfg.use_attention_bias or cfg.use_attn_proj_bias:
        raise ValueError("mixtral: cannot express attention biases or q/k layernorm")
    if (
        cfg.n_experts < 1
        or cfg.moe_layers != list(range(cfg.n_layers))
        or not cfg.norm_topk_prob
        or cfg.shared_expert_intermediate_dim
    ):
        raise ValueError(
            "mixtral: needs experts in every block (n_experts >= 1, no mlp_only_layers, "
            "decoder_sparse_step 1), renormalised top-k weights (norm_topk_prob) and no shared expert"
        )
    return _llama_like.config_to_hf(
        cfg,
        "mixtral",
        "MixtralForCausalLM",
        intermediate_size=cfg.moe_intermediate_dim,
        sliding_window=cfg.sliding_window,
        num_local_experts=cfg.n_experts,
        num_experts_per_tok=cfg.n_experts_per_tok,
        router_aux_loss_coef=cfg.router_aux_loss_coef,
    )


_llama_like.register_llama_like("mixtral", config_from_hf, config_to_hf, KEYS)
