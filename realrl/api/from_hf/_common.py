"""What every family shares: ReaLModel parameter names and rotary-config spelling.

ReaLModel's parameter names (the converters map to and from these):

    embed.wte.weight, embed.wpe.weight (learned absolute positions)
    layers.{i}.attn_ln.{weight,bias}
    layers.{i}.attn.{q,k,v,o}.{weight,bias}, layers.{i}.attn.{q_ln,k_ln}.weight
    layers.{i}.mlp_ln.{weight,bias}
    layers.{i}.mlp.{gate,up,down}.{weight,bias}            (a dense block)
    layers.{i}.mlp.router.weight                           (a sparse block: Mixture of Experts)
    layers.{i}.mlp.experts.{e}.{gate,up,down}.weight
    layers.{i}.mlp.shared.{gate,up,down}.weight, layers.{i}.mlp.shared_gate.weight
    final_ln.{weight,bias}, head.weight (LM or scalar head), head.bias (scalar head)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from realrl.api.core.hf_family import HFFamily, register_hf_family
from realrl.api.core.model_api import ReaLModelConfig


class HFConfig:
    """A Hugging Face ``config.json`` (a dict) or a transformers config object, as the families
    read it: its values as attributes, then the architecture's ``defaults`` for what it lacks.

    A family's defaults are its transformers config class's (``tests/model/test_hf_config.py``
    compares them), so reading a checkpoint's config needs no transformers: a model worker
    loads and saves checkpoints without importing transformers' config classes (~60 MB and
    ~0.6 s per worker process on transformers 5)."""

    def __init__(self, values: Mapping[str, Any] | Any, defaults: Mapping[str, Any]):
        self._values, self._defaults = values, defaults

    def __getattr__(self, name: str) -> Any:
        values, defaults = self.__dict__["_values"], self.__dict__["_defaults"]
        if isinstance(values, Mapping):
            if name in values:
                return values[name]
        elif hasattr(values, name):
            return getattr(values, name)
        if name in defaults:
            return defaults[name]
        raise AttributeError(f"the HF config has no {name!r} and its family no default for it")


# what every llama-shaped family shares (transformers 5's LlamaConfig defaults, rope in the older
# spelling so that a config.json with ``rope_theta`` and no ``rope_parameters`` reads right)
LLAMA_LIKE_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,
    "head_dim": None,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def hf_config_dict(model_type: str, architecture: str, **fields: Any) -> dict[str, Any]:
    """What a family's ``config_to_hf`` returns: the ``config.json`` of ``model_type`` holding
    ``fields`` (transformers fills the rest with its class defaults when it loads the file)."""
    return {"model_type": model_type, "architectures": [architecture], **fields}


def register_family(
    name: str,
    config_from_hf: Callable[[Any], ReaLModelConfig],
    config_to_hf: Callable[[ReaLModelConfig], dict[str, Any]],
    sd_from_hf: Callable,
    sd_to_hf: Callable,
) -> HFFamily:
    """Register the family ``name`` for the HF ``model_type`` of the same name, its parameters
    named as every ReaLModel's (``embedding_param_names``, ``tblock_param_names``,
    ``head_param_names``)."""
    param_names = (embedding_param_names, tblock_param_names, head_param_names)
    return register_hf_family(name, name, config_from_hf, config_to_hf, sd_from_hf, sd_to_hf, *param_names)


def embedding_param_names(cfg: ReaLModelConfig) -> list[str]:
    names = ["embed.wte.weight"]
    if cfg.abs_position_embedding:
        names.append("embed.wpe.weight")
    return names


def tblock_param_names(cfg: ReaLModelConfig, idx: int) -> list[str]:
    p = f"layers.{idx}."
    norm_params = ["weight", "bias"] if cfg.layer_norm_type == "layer" else ["weight"]
    names = [p + "attn_ln." + n for n in norm_params]
    for proj in ("q", "k", "v"):
        names.append(f"{p}attn.{proj}.weight")
        if cfg.use_attention_bias:
            names.append(f"{p}attn.{proj}.bias")
    names.append(f"{p}attn.o.weight")
    if cfg.use_attn_proj_bias:
        names.append(f"{p}attn.o.bias")
    if cfg.qk_layernorm:
        names += [f"{p}attn.q_ln.weight", f"{p}attn.k_ln.weight"]
    names += [p + "mlp_ln." + n for n in norm_params]
    if cfg.is_moe_layer(idx):
        return names + moe_param_names(cfg, idx)
    projs = ("gate", "up", "down") if cfg.mlp_type == "gated" else ("up", "down")
    for proj in projs:
        names.append(f"{p}mlp.{proj}.weight")
        if cfg.use_mlp_bias:
            names.append(f"{p}mlp.{proj}.bias")
    return names


def moe_param_names(cfg: ReaLModelConfig, idx: int, experts: range | None = None) -> list[str]:
    """A sparse block's MLP parameters: its router, the ``experts`` (default: all) and the shared
    expert; expert parallelism will list a rank's own experts."""
    p = f"layers.{idx}.mlp."
    names = [p + "router.weight"]
    for e in range(cfg.n_experts) if experts is None else experts:
        names += [f"{p}experts.{e}.{proj}.weight" for proj in ("gate", "up", "down")]
    if cfg.shared_expert_intermediate_dim:
        names += [f"{p}shared.{proj}.weight" for proj in ("gate", "up", "down")] + [p + "shared_gate.weight"]
    return names


def head_param_names(cfg: ReaLModelConfig) -> list[str]:
    norm_params = ["weight", "bias"] if cfg.layer_norm_type == "layer" else ["weight"]
    names = ["final_ln." + n for n in norm_params] + ["head.weight"]
    if cfg.is_critic:
        names.append("head.bias")
    return names


def rope_from_hf(hf: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling dict or None) from either spelling: transformers>=5 ``rope_parameters``
    or the older ``rope_theta`` + ``rope_scaling``."""
    params = getattr(hf, "rope_parameters", None)
    if params:
        params = dict(params)
        theta = float(params.pop("rope_theta", getattr(hf, "rope_theta", 10000.0)))
        rope_type = params.get("rope_type", params.get("type", "default"))
        return theta, (None if rope_type == "default" else params)
    theta = float(getattr(hf, "rope_theta", 10000.0))
    scaling = getattr(hf, "rope_scaling", None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        scaling = dict(scaling)
        theta = float(scaling.pop("rope_theta", theta))
        return theta, scaling
    return theta, None


def rope_to_hf(cfg: ReaLModelConfig) -> dict[str, Any]:
    params: dict[str, Any] = {"rope_theta": cfg.rotary_base, "rope_type": "default"}
    if cfg.rotary_scaling:
        params.update(cfg.rotary_scaling)
        params.setdefault("rope_type", params.get("type", "default"))
    return params


def token_ids(hf: Any) -> dict[str, int | None]:
    def first(x):
        return x[0] if isinstance(x, list | tuple) and x else x

    return {
        "bos_token_id": first(getattr(hf, "bos_token_id", None)),
        "eos_token_id": first(getattr(hf, "eos_token_id", None)),
        "pad_token_id": first(getattr(hf, "pad_token_id", None)),
    }
