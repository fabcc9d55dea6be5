"""LoRA adapters on a ReaLModel, through peft ("LoRA: Low-Rank Adaptation of Large Language
Models", Hu et al. 2021).

peft's ``LoraConfig`` and its ``Linear`` layers are injected into ReaLModel's linear modules by
name (``q k v o gate up down``, or the Hugging Face names ``q_proj`` ...); peft freezes
everything else, and this module unfreezes a critic's value head, which is new and must train.
What peft cannot do for ReaLModel lives here: the merged state dict in ReaLModel's own names
(what ``checkpoints/<role>/final`` holds), the adapters in peft's folder format under the Hugging
Face module names (``checkpoints/<role>/final/adapter``), the adapters-off context the reference
model runs in, and the names of the parameters a reallocation moves once the base is in place.

A LoRA layer keeps ``W`` and adds ``scale * B @ A`` on the side; ``B`` starts at zero, so a model
with fresh adapters computes exactly what its base does.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import torch
from torch import nn

from realrl.api.core.lora import LoRAConfig

ADAPTER_DIR = "adapter"  # checkpoints/<role>/final/adapter: the peft folder
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"  # peft's name of the one adapter a model holds
PEFT_PREFIX = "base_model.model."  # what PeftModel puts before the base model's parameter names


class NoAdapterFolder(ValueError):
    """The family has no Hugging Face module of its own for an adapted linear (gpt2 fuses q, k
    and v into one): its adapters cannot be written as a peft folder."""


def add_adapters(module: nn.Module, cfg: LoRAConfig, seed: int = 0) -> None:
    """Inject peft LoRA layers into ``module``'s target linears (in place). Adapters start the
    same on every rank (drawn from ``seed``, not from the caller's RNG); only they, and a
    critic's head, require gradients."""
    from peft import LoraConfig, inject_adapter_in_model

    peft_cfg = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=cfg.modules()
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(peft_cfg, module, adapter_name=ADAPTER_NAME)
    if getattr(module.config, "is_critic", False):
        module.head.requires_grad_(True)  # a new value head: trained with the adapters
    module.lora = cfg


@torch.no_grad()
def keep_frozen_in(module: nn.Module, dtype: torch.dtype) -> int:
    """Store the frozen weight matrices (the base's linears and embeddings) in ``dtype`` (bf16:
    half the base's memory) while the adapters keep training in fp32; 1-D weights (norms,
    biases) stay as they are. Returns how many tensors were converted."""
    n = 0
    for p in module.parameters():
        if not p.requires_grad and p.ndim >= 2 and p.dtype != dtype:
            p.data = p.data.to(dtype)
            n += 1
    return n


def is_adapter_layer(module: nn.Module) -> bool:
    """A peft layer wrapping a linear (it must run its own forward: ``W`` alone misses ``B @ A``)."""
    return hasattr(module, "base_layer") and hasattr(module, "lora_A")


def adapter_layers(module: nn.Module) -> Iterator[nn.Module]:
    return (m for m in module.modules() if is_adapter_layer(m))


@contextlib.contextmanager
def adapters_disabled(module: nn.Module) -> Iterator[None]:
    """``module`` computes as its base inside the block (the reference policy of a LoRA actor):
    exact, because the base weights are never trained."""
    layers = list(adapter_layers(module))
    if not layers:
        raise ValueError(f"{type(module).__name__} has no LoRA adapters to turn off")
    trainable = {id(p): p.requires_grad for p in module.parameters()}
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p in module.parameters():  # enable_adapters toggles requires_grad; put it back as it was
            p.requires_grad_(trainable[id(p)])


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def trained_param_names(names: list[str], is_critic: bool) -> list[str]:
    """What changes when a LoRA model trains: its adapters, and a critic's head. A reallocation
    whose destination already holds the base moves only these."""
    return [n for n in names if is_adapter_param(n) or (is_critic and n.startswith("head."))]


def merged_state_dict(sd: dict[str, torch.Tensor], cfg: LoRAConfig) -> dict[str, torch.Tensor]:
    """``sd`` of an adapted ReaLModel as a plain ReaLModel's: each adapted linear's weight is
    ``W + scale * B @ A`` (computed in fp32, stored in ``W``'s dtype) under its own name."""
    out: dict[str, torch.Tensor] = {}
    for key, t in sd.items():
        if is_adapter_param(key):
            continue
        if ".base_layer." not in key:
            out[key] = t
            continue
        layer, param = key.rsplit(".base_layer.", 1)
        if param == "weight":
            a = sd[f"{layer}.lora_A.{ADAPTER_NAME}.weight"].float()
            b = sd[f"{layer}.lora_B.{ADAPTER_NAME}.weight"].float()
            t = (t.float() + cfg.scaling * (b @ a)).to(t.dtype)
        out[f"{layer}.{param}"] = t
    return out


def save_adapter_folder(
    sd: dict[str, torch.Tensor],
    cfg: LoRAConfig,
    to_hf,
    save_dir: str,
    base_path: str | None,
    is_critic: bool,
) -> None:
    """The adapters of ``sd`` as the folder ``peft.PeftModel.from_pretrained(base, save_dir)``
    loads: ``adapter_config.json`` and ``adapter_model.safetensors`` under the Hugging Face
    module names (``to_hf``: the family's ReaLModel -> HF state-dict renaming). A critic's
    folder also holds its value head (``value_head.safetensors``, ReaLModel's names)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    targets: set[str] = set()
    for key, t in sd.items():
        if not is_adapter_param(key):
            continue
        layer, rest = key.split(".lora_", 1)  # layers.0.attn.q, A.default.weight
        hf = _hf_module_name(layer, to_hf)
        targets.add(hf.rsplit(".", 1)[-1])
        side = rest.split(".", 1)[0]  # A or B
        tensors[f"{PEFT_PREFIX}{hf}.lora_{side}.weight"] = t.detach().cpu().contiguous()
    os.makedirs(save_dir, exist_ok=True)
    peft_cfg = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=sorted(targets),
        task_type=None if is_critic else "CAUSAL_LM",
        base_model_name_or_path=base_path,
    )
    peft_cfg.save_pretrained(save_dir)
    save_file(tensors, os.path.join(save_dir, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    if is_critic:
        head = {
            k[len("head.") :]: v.detach().cpu().contiguous() for k, v in sd.items() if k.startswith("head.")
        }
        save_file(head, os.path.join(save_dir, "value_head.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(save_dir, "README.md"), "w") as f:
        f.write(_readme(cfg, base_path))


def _hf_module_name(layer: str, to_hf) -> str:
    """``layers.0.attn.q`` -> ``model.layers.0.self_attn.q_proj`` through the family's renaming;
    ``NoAdapterFolder`` when the family stores the weight otherwise than renamed (fused with
    others, or transposed as gpt2's Conv1D modules are): peft's layers there differ from ours."""
    probe = torch.empty(2, 3)
    try:
        renamed = to_hf({f"{layer}.weight": probe})
    except KeyError as e:  # gpt2 asks for q, k and v together
        raise NoAdapterFolder(f"{layer!r} has no Hugging Face module of its own ({e})") from None
    if len(renamed) != 1 or next(iter(renamed.values())) is not probe:
        raise NoAdapterFolder(f"{layer!r} is stored fused or transposed in the Hugging Face layout")
    return next(iter(renamed)).removesuffix(".weight")


def _readme(cfg: LoRAConfig, base_path: str | None) -> str:
    base = base_path or "<the base model folder>"
    return (
        "# LoRA adapters written by realrl\n\n"
        f"rank {cfg.rank}, alpha {cfg.alpha:g}, on {', '.join(cfg.modules())}. Load them with\n\n"
        "```python\n"
        "from peft import PeftModel\n"
        "from transformers import AutoModelForCausalLM\n"
        f"model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base!r}), {json.dumps('.')})\n"
        "```\n\n"
        "The folder above holds the same model with the adapters merged into its weights.\n"
    )
