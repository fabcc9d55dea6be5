"""GPT-2: LayerNorm with biases, learned absolute positions, tied embeddings, fused q/k/v.

HF stores GPT-2's linear layers as ``Conv1D`` (weight [in, out]); ReaLModel uses ``nn.Linear``
(weight [out, in]), so every projection is transposed on the way in and out.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.from_hf import _common

if TYPE_CHECKING:  # converters run in workers; reading configs needs no torch
    import torch

_IGNORED_HF = re.compile(r".*\.attn\.(bias|masked_bias)$")
_PLAIN = {  # HF suffix -> ReaL suffix, same tensor layout
    "ln_1.weight": "attn_ln.weight",
    "ln_1.bias": "attn_ln.bias",
    "ln_2.weight": "mlp_ln.weight",
    "ln_2.bias": "mlp_ln.bias",
    "attn.c_proj.bias": "attn.o.bias",
    "mlp.c_fc.bias": "mlp.up.bias",
    "mlp.c_proj.bias": "mlp.down.bias",
}
_TRANSPOSED = {
    "attn.c_proj.weight": "attn.o.weight",
    "mlp.c_fc.weight": "mlp.up.weight",
    "mlp.c_proj.weight": "mlp.down.weight",
}
_TOP = {
    "transformer.wte.weight": "embed.wte.weight",
    "transformer.wpe.weight": "embed.wpe.weight",
    "transformer.ln_f.weight": "final_ln.weight",
    "transformer.ln_f.bias": "final_ln.bias",
}
_LAYER_HF = re.compile(r"transformer\.h\.(\d+)\.(.+)$")
_LAYER_REAL = re.compile(r"layers\.(\d+)\.(.+)$")


def sd_from_hf(sd: dict[str, torch.Tensor], cfg: ReaLModelConfig) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, t in sd.items():
        if _IGNORED_HF.match(key) or key == "lm_head.weight":  # lm_head is tied to wte
            continue
        if key in _TOP:
            out[_TOP[key]] = t
            continue
        m = _LAYER_HF.match(key)
        if m is None:
            raise KeyError(f"gpt2 sd_from_hf: no mapping for parameter {key!r}")
        p, rest = f"layers.{m.group(1)}.", m.group(2)
        if rest in _PLAIN:
            out[p + _PLAIN[rest]] = t
        elif rest in _TRANSPOSED:
            out[p + _TRANSPOSED[rest]] = t.t().contiguous()
        elif rest == "attn.c_attn.weight":
            for name, part in zip("qkv", t.t().chunk(3, dim=0)):
                out[f"{p}attn.{name}.weight"] = part.contiguous()
        elif rest == "attn.c_attn.bias":
            for name, part in zip("qkv", t.chunk(3, dim=0)):
                out[f"{p}attn.{name}.bias"] = part.contiguous()
        else:
            raise KeyError(f"gpt2 sd_from_hf: no mapping for parameter {key!r}")
    return out


def sd_to_hf(sd: dict[str, torch.Tensor], cfg: ReaLModelConfig) -> dict[str, torch.Tensor]:
    inv_top = {v: k for k, v in _TOP.items()}
    inv_plain = {v: k for k, v in _PLAIN.items()}
    inv_t = {v: k for k, v in _TRANSPOSED.items()}
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, t in sd.items():
        if key.startswith("head."):  # tied to wte (LM) or saved apart (critic)
            continue
        if key in inv_top:
            out[inv_top[key]] = t
            continue
        m = _LAYER_REAL.match(key)
        if m is None:
            raise KeyError(f"gpt2 sd_to_hf: no mapping for parameter {key!r}")
        p, rest = f"transformer.h.{m.group(1)}.", m.group(2)
        if rest in inv_plain:
            out[p + inv_plain[rest]] = t
        elif rest in inv_t:
            out[p + inv_t[rest]] = t.t().contiguous()
        elif re.fullmatch(r"attn\.[qkv]\.(weight|bias)", rest):
            qkv.setdefault((p, rest.split(".")[2]), {})[rest.split(".")[1]] = t
        else:
            raise KeyError(f"gpt2 sd_to_hf: no mapping for parameter {key!r}")
    for (p, kind), parts in qkv.items():
        if set(parts) != set("qkv"):
            raise KeyError(f"gpt2 sd_to_hf: {p}attn needs q, k and v {kind} together, got {sorted(parts)}")
        import torch  # converting tensors: in a worker, where torch is loaded

        fused = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
        out[f"{p}attn.c_attn.{kind}"] = fused.t().contiguous() if kind == "weight" else fused
    return out


# transformers' GPT2Config defaults for what config_from_hf reads
DEFAULTS = {
    "n_inner": None,
    "n_positions": 1024,
    "layer_norm_epsilon": 1e-5,
    "activation_function": "gelu_new",
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "resid_pdrop": 0.1,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "pad_token_id": None,
}


def config_from_hf(hf: Any) -> ReaLModelConfig:
    hf = _common.HFConfig(hf, DEFAULTS)
    if getattr(hf, "scale_attn_by_inverse_layer_idx", False) or not getattr(hf, "scale_attn_weights", True):
        raise ValueError(
            "gpt2: scale_attn_by_inverse_layer_idx=True / scale_attn_weights=False are not supported"
        )
    return ReaLModelConfig(
        n_layers=hf.n_layer,
        n_q_heads=hf.n_head,
        n_kv_heads=hf.n_head,
        hidden_dim=hf.n_embd,
        intermediate_dim=hf.n_inner or 4 * hf.n_embd,
        vocab_size=hf.vocab_size,
        n_positions=hf.n_positions,
        layer_norm_type="layer",
        layer_norm_epsilon=hf.layer_norm_epsilon,
        mlp_type="plain",
        activation_function=hf.activation_function,
        use_attention_bias=True,
        use_attn_proj_bias=True,
        use_mlp_bias=True,
        apply_rotary=False,
        abs_position_embedding=True,
        tied_embedding=True,
        embd_pdrop=hf.embd_pdrop,
        attn_pdrop=hf.attn_pdrop,
        resid_pdrop=hf.resid_pdrop,
        hf_model_type="gpt2",
        **_common.token_ids(hf),
    )


def config_to_hf(cfg: ReaLModelConfig) -> dict[str, Any]:
    shape_ok = (
        cfg.layer_norm_type == "layer"
        and cfg.mlp_type == "plain"
        and cfg.abs_position_embedding
        and not cfg.apply_rotary
        and cfg.n_kv_heads == cfg.n_q_heads
        and cfg.use_attention_bias
        and cfg.use_attn_proj_bias
        and cfg.use_mlp_bias
        and cfg.tied_embedding
        and not cfg.qk_layernorm
        and cfg.head_dim * cfg.n_q_heads == cfg.hidden_dim
        and not cfg.sliding_window
    )
    if not shape_ok:
        raise ValueError(
            f"gpt2: config is not GPT-2 shaped (LayerNorm, plain MLP, biases, tied, abs positions): {cfg}"
        )
    return _common.hf_config_dict(
        "gpt2",
        "GPT2LMHeadModel",
        n_layer=cfg.n_layers,
        n_head=cfg.n_q_heads,
        n_embd=cfg.hidden_dim,
        n_inner=cfg.intermediate_dim,
        vocab_size=cfg.vocab_size,
        n_positions=cfg.n_positions,
        layer_norm_epsilon=cfg.layer_norm_epsilon,
        activation_function=cfg.activation_function,
        embd_pdrop=cfg.embd_pdrop,
        attn_pdrop=cfg.attn_pdrop,
        resid_pdrop=cfg.resid_pdrop,
        tie_word_embeddings=True,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    )


_common.register_family("gpt2", config_from_hf, config_to_hf, sd_from_hf, sd_to_hf)
