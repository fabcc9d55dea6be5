"""Hugging Face checkpoint folders <-> ReaLModel, through the family registry (api/from_hf).

A critic is saved as the HF checkpoint of its body plus ``critic_head.safetensors`` and a
``realrl_critic`` marker in config.json, so ``AutoModelForCausalLM`` still loads the body and
``from_pretrained(..., is_critic=True)`` restores the head exactly.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import uuid
from typing import Any

import torch

import realrl.api.from_hf  # noqa: F401  (registers the families)
from realrl.api.core.model_api import HFFamily, ReaLModelConfig, get_hf_family, hf_family_for_model_type

CRITIC_HEAD_FILE = "critic_head.safetensors"
CRITIC_MARKER = "realrl_critic"
_WEIGHTS_FILE = "model.safetensors"


def infer_hf_model_type(cfg: ReaLModelConfig) -> str:
    """The family a config saves as when it does not say (``cfg.hf_model_type`` is None)."""
    if cfg.hf_model_type:
        return cfg.hf_model_type
    if cfg.abs_position_embedding:
        return "gpt2"
    if cfg.qk_layernorm:
        return "qwen3"
    if cfg.use_attention_bias and not cfg.use_attn_proj_bias:
        return "qwen2"
    if cfg.sliding_window:
        return "mistral"
    return "llama"


def family_of(cfg: ReaLModelConfig) -> HFFamily:
    model_type = infer_hf_model_type(cfg)
    try:
        return hf_family_for_model_type(model_type)
    except LookupError:
        return get_hf_family(model_type)


def read_hf_state_dict(path: str) -> dict[str, torch.Tensor]:
    """All weights of a checkpoint folder: *.safetensors (sharded or not), else *.bin."""
    from safetensors.torch import load_file

    files = sorted(
        f for f in glob.glob(os.path.join(path, "*.safetensors")) if not f.endswith(CRITIC_HEAD_FILE)
    )
    if not files:
        files = sorted(glob.glob(os.path.join(path, "*.bin")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors or *.bin weights in checkpoint folder {path!r}")
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(torch.load(f, map_location="cpu", weights_only=True))
        return sd
    sd = {}
    for f in files:
        sd.update(load_file(f, device="cpu"))
    return sd


def load_pretrained(
    cls,
    path: str,
    is_critic: bool,
    dtype: torch.dtype | None,
    attn_impl: str,
    device: torch.device | str | None,
    critic_head_init: str,
):
    import transformers

    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"{path!r} is not a Hugging Face checkpoint folder (no config.json)")
    with open(cfg_file) as f:
        raw = json.load(f)
    saved_critic = CRITIC_MARKER in raw
    if saved_critic and not is_critic:
        raise ValueError(f"{path!r} holds a critic (scalar head); load it with is_critic=True")
    hf_cfg = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    family = hf_family_for_model_type(hf_cfg.model_type)
    cfg = family.config_from_hf(hf_cfg)
    cfg.is_critic = is_critic
    sd = family.sd_from_hf(read_hf_state_dict(path), cfg)
    if saved_critic:
        from safetensors.torch import load_file

        head = load_file(os.path.join(path, raw[CRITIC_MARKER].get("head_file", CRITIC_HEAD_FILE)))
        sd.update({f"head.{k}": v for k, v in head.items()})
    model = cls(
        cfg,
        dtype=dtype or torch.float32,
        device=device,
        attn_impl=attn_impl,
        critic_head_init=critic_head_init,
    )
    missing, unexpected = model.load_state_dict(sd, strict=False)
    allowed = {"head.weight", "head.bias"} if (is_critic and not saved_critic) else set()
    if cfg.tied_embedding and not is_critic:
        allowed.add("head.weight")
    missing = sorted(set(missing) - allowed)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path!r} does not fit {family.name}: missing {missing}, unexpected {unexpected}"
        )
    return model


def _swap_into_place(tmp: str, save_dir: str) -> None:
    """Replace ``save_dir`` by ``tmp`` with renames only: a reader never sees a half-written folder."""
    if not os.path.exists(save_dir):
        os.rename(tmp, save_dir)
        return
    old = f"{save_dir}.old-{uuid.uuid4().hex[:8]}"
    os.rename(save_dir, old)
    os.rename(tmp, save_dir)
    shutil.rmtree(old, ignore_errors=True)


def save_pretrained(
    model, save_dir: str, tokenizer: Any = None, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    import transformers
    from safetensors.torch import save_file

    cfg: ReaLModelConfig = model.config
    family = family_of(cfg)
    hf_cfg = family.config_to_hf(cfg)
    arch = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(hf_cfg.model_type)
    if arch:
        hf_cfg.architectures = [arch]
    hf_cfg.dtype = model.dtype
    source = model.state_dict() if state_dict is None else state_dict
    sd = {k: v.detach().cpu().contiguous() for k, v in source.items()}
    head = {k[len("head.") :]: sd.pop(k) for k in list(sd) if k.startswith("head.")} if cfg.is_critic else {}
    hf_sd = family.sd_to_hf(sd, cfg)

    save_dir = os.path.abspath(save_dir.rstrip("/"))
    os.makedirs(os.path.dirname(save_dir), exist_ok=True)
    tmp = f"{save_dir}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        hf_cfg.save_pretrained(tmp)
        save_file(hf_sd, os.path.join(tmp, _WEIGHTS_FILE), metadata={"format": "pt"})
        if cfg.is_critic:
            save_file(head, os.path.join(tmp, CRITIC_HEAD_FILE), metadata={"format": "pt"})
            with open(os.path.join(tmp, "config.json")) as f:
                raw = json.load(f)
            raw[CRITIC_MARKER] = {"head_file": CRITIC_HEAD_FILE}
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(raw, f, indent=2, sort_keys=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _swap_into_place(tmp, save_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
