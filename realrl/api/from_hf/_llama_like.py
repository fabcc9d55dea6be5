"""Key remapping and registration shared by the llama-shaped families (llama, mistral, qwen2,
qwen3, and the Mixture-of-Experts ones through ``_moe``).

These families differ only in their config (biases, q/k norm, sliding window), not in their
parameter names, so one table maps them all; each family file owns its config translation and
registers it with ``register_llama_like``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from realrl.api.core.hf_family import HFFamily
from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf._common import hf_config_dict, register_family, rope_from_hf, rope_to_hf, token_ids

if TYPE_CHECKING:  # converters run in workers; reading configs needs no torch
    import torch

# (HF pattern, ReaL pattern); {i} is a layer index, {p} a parameter name (weight/bias)
TABLE: list[tuple[str, str]] = (
    [
        ("model.embed_tokens.weight", "embed.wte.weight"),
        ("model.norm.weight", "final_ln.weight"),
        ("lm_head.weight", "head.weight"),
        ("model.layers.{i}.input_layernorm.weight", "layers.{i}.attn_ln.weight"),
        ("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.mlp_ln.weight"),
        ("model.layers.{i}.self_attn.q_norm.weight", "layers.{i}.attn.q_ln.weight"),
        ("model.layers.{i}.self_attn.k_norm.weight", "layers.{i}.attn.k_ln.weight"),
    ]
    + [(f"model.layers.{{i}}.self_attn.{x}_proj.{{p}}", f"layers.{{i}}.attn.{x}.{{p}}") for x in "qkvo"]
    + [
        (f"model.layers.{{i}}.mlp.{x}_proj.{{p}}", f"layers.{{i}}.mlp.{x}.{{p}}")
        for x in ("gate", "up", "down")
    ]
)

_IGNORED_HF = re.compile(r".*rotary_emb\.inv_freq$")


def _compile(pattern: str) -> re.Pattern:
    rx = (
        re.escape(pattern)
        .replace(r"\{i\}", r"(?P<i>\d+)")
        .replace(r"\{e\}", r"(?P<e>\d+)")
        .replace(r"\{p\}", r"(?P<p>weight|bias)")
    )
    return re.compile(rx + "$")


def _remap(sd: dict[str, torch.Tensor], table, what: str) -> dict[str, torch.Tensor]:
    out = {}
    for key, tensor in sd.items():
        for rx, target in table:
            m = rx.match(key)
            if m:
                out[target.format(**m.groupdict())] = tensor
                break
        else:
            raise KeyError(f"{what}: no mapping for parameter {key!r}")
    return out


class KeyMap:
    """The state-dict converters of one table of (HF pattern, ReaL pattern) rows; {e} is an
    expert index. Writing, the first row that matches a ReaL name gives its HF name."""

    def __init__(self, table: list[tuple[str, str]], what: str):
        self.what = what
        self.from_table = [(_compile(h), r) for h, r in table]
        self.to_table = [(_compile(r), h) for h, r in table]

    def sd_from_hf(self, sd: dict[str, torch.Tensor], cfg: ReaLModelConfig) -> dict[str, torch.Tensor]:
        sd = {k: v for k, v in sd.items() if not _IGNORED_HF.match(k)}
        if cfg.is_critic:  # a critic keeps its own scalar head, never the LM head
            sd.pop("lm_head.weight", None)
        return _remap(sd, self.from_table, f"{self.what} sd_from_hf")

    def sd_to_hf(self, sd: dict[str, torch.Tensor], cfg: ReaLModelConfig) -> dict[str, torch.Tensor]:
        if cfg.is_critic or cfg.tied_embedding:  # critic head is saved apart; tied head is wte
            sd = {k: v for k, v in sd.items() if not k.startswith("head.")}
        return _remap(sd, self.to_table, f"{self.what} sd_to_hf")


class StateDictConverters(Protocol):
    """A family's state-dict converters: a ``KeyMap``, or ``_moe.MoEKeyMap`` for sparse blocks."""

    def sd_from_hf(self, sd: dict[str, torch.Tensor], cfg: ReaLModelConfig) -> dict[str, torch.Tensor]: ...

    def sd_to_hf(self, sd: dict[str, torch.Tensor], cfg: ReaLModelConfig) -> dict[str, torch.Tensor]: ...


DENSE_KEYS = KeyMap(TABLE, "llama-like")


def register_llama_like(
    name: str,
    config_from_hf: Callable[[Any], ReaLModelConfig],
    config_to_hf: Callable[[ReaLModelConfig], dict[str, Any]],
    keys: StateDictConverters = DENSE_KEYS,
) -> HFFamily:
    """Register the llama-shaped family ``name`` (its HF ``model_type`` too) with its config
    translation; its parameters map by ``keys`` (the dense llama table unless it has experts)."""
    return register_family(name, config_from_hf, config_to_hf, keys.sd_from_hf, keys.sd_to_hf)


def config_from_hf(hf: Any, **fields: Any) -> ReaLModelConfig:
    """Common fields of a llama-shaped HF config; ``fields`` are family-specific overrides."""
    theta, scaling = rope_from_hf(hf)
    base = dict(
        n_layers=hf.num_hidden_layers,
        n_q_heads=hf.num_attention_heads,
        n_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        hidden_dim=hf.hidden_size,
        intermediate_dim=hf.intermediate_size,
        vocab_size=hf.vocab_size,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        n_positions=hf.max_position_embeddings,
        layer_norm_type="rms",
        layer_norm_epsilon=hf.rms_norm_eps,
        mlp_type="gated",
        activation_function=hf.hidden_act,
        use_attention_bias=bool(getattr(hf, "attention_bias", False)),
        use_attn_proj_bias=bool(getattr(hf, "attention_bias", False)),
        use_mlp_bias=bool(getattr(hf, "mlp_bias", False)),
        apply_rotary=True,
        rotary_base=theta,
        rotary_scaling=scaling,
        tied_embedding=bool(getattr(hf, "tie_word_embeddings", False)),
        attn_pdrop=float(getattr(hf, "attention_dropout", 0.0) or 0.0),
        hf_model_type=hf.model_type,
        **token_ids(hf),
    )
    base.update(fields)
    return ReaLModelConfig(**base)


def config_to_hf(cfg: ReaLModelConfig, model_type: str, architecture: str, **fields: Any) -> dict[str, Any]:
    """The ``config.json`` of ``model_type`` holding ``cfg``; ``fields`` are family-specific."""
    kwargs = dict(
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_q_heads,
        num_key_value_heads=cfg.n_kv_heads,
        hidden_size=cfg.hidden_dim,
        intermediate_size=cfg.intermediate_dim,
        vocab_size=cfg.vocab_size,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.n_positions,
        rms_norm_eps=cfg.layer_norm_epsilon,
        hidden_act=cfg.activation_function,
        rope_parameters=rope_to_hf(cfg),
        tie_word_embeddings=cfg.tied_embedding,
        attention_dropout=cfg.attn_pdrop,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    )
    kwargs.update(fields)
    return hf_config_dict(model_type, architecture, **kwargs)


def check_llama_shape(cfg: ReaLModelConfig, family: str) -> None:
    """A family can only save what its HF architecture can express."""
    if cfg.layer_norm_type != "rms" or cfg.mlp_type != "gated" or cfg.abs_position_embedding:
        raise ValueError(
            f"{family}: needs RMSNorm, a gated MLP and rotary positions; got layer_norm_type="
            f"{cfg.layer_norm_type!r}, mlp_type={cfg.mlp_type!r}, abs_position_embedding={cfg.abs_position_embedding}"
        )
