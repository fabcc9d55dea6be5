"""Model factories registered with ``register_model``: "real_model" and "null" (tokenizer only)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from realrl.api.core.config import ModelName
from realrl.api.core.data_api import load_hf_tokenizer
from realrl.api.core.lora import LoRAConfig, lora_of
from realrl.api.core.model_api import Model, ReaLModelConfig, register_model
from realrl.impl.model.nn.lora import add_adapters
from realrl.impl.model.nn.real_model import ReaLModel

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    aliases = {
        "fp32": "float32",
        "fp16": "float16",
        "bf16": "bfloat16",
        "half": "float16",
        "float": "float32",
    }
    name = aliases.get(dtype, dtype)
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16', 'float16'")
    return value


def _tokenizer(tokenizer_path: str | None, path: str | None):
    if tokenizer_path is not None:
        return load_hf_tokenizer(tokenizer_path)
    if path is not None and any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        return load_hf_tokenizer(path)
    return None


def _stage_cut(parallel: Any) -> Callable[[ReaLModel], nn.Module] | None:
    """What cuts a whole model into this rank's pipeline stage (None: no pipeline stages)."""
    if parallel is None or parallel.layout.pp == 1:
        return None
    from realrl.impl.model.parallel.pipeline import PipelineStage

    def cut(model: ReaLModel) -> nn.Module:
        return PipelineStage.of(model, parallel.stage, parallel.layout.pp)

    return cut


def make_real_model(
    name: ModelName,
    device: torch.device | str = "cpu",
    path: str | None = None,
    config: dict[str, Any] | ReaLModelConfig | None = None,
    is_critic: bool = False,
    dtype: str | torch.dtype | None = None,
    attn_impl: str = "auto",
    tokenizer_path: str | None = None,
    critic_head_init: str = "reward",
    parallel: Any = None,
    lora: dict[str, Any] | LoRAConfig | None = None,
) -> Model:
    """A ReaLModel from an HF checkpoint folder (``path``) or random weights (``config``).

    ``parallel`` (the model's ``ParallelContext``, given by the model worker): a checkpoint is
    loaded already split over its tensor-parallel ranks, each reading only its slices, and cut
    to this rank's pipeline stage, each stage reading only its layers' tensors. Random
    weights are drawn whole (every rank the same) and split by the backend. ``lora``
    (``nn/lora.py``'s options, rank > 0): peft adapters on the loaded weights, the rest frozen."""
    torch_dtype = parse_dtype(dtype)
    cut = _stage_cut(parallel)
    if (path is None) == (config is None):
        raise ValueError(
            f"model {name}: give exactly one of path= (HF checkpoint) or config= (random weights)"
        )
    if path is not None:
        module = ReaLModel.from_pretrained(
            path,
            is_critic=is_critic,
            dtype=torch_dtype,
            attn_impl=attn_impl,
            device=device,
            critic_head_init=critic_head_init,
            tp_mesh=parallel.tp_mesh if parallel is not None and parallel.layout.tp > 1 else None,
            cut=cut,
        )
    else:
        fields = dict(config.__dict__) if isinstance(config, ReaLModelConfig) else dict(config)
        fields["is_critic"] = is_critic
        module = ReaLModel(
            ReaLModelConfig(**fields),
            dtype=torch_dtype,
            device=device,
            attn_impl=attn_impl,
            critic_head_init=critic_head_init,
        )
        if cut is not None:  # every stage drew the whole model alike; each keeps its own layers
            module = cut(module)
    module.base_path = path
    adapters = lora_of({"lora": lora})
    if adapters is not None:
        if parallel is not None and (parallel.layout.tp > 1 or parallel.layout.pp > 1):
            raise ValueError(
                f"model {name}: LoRA adapters are not split by tensor or pipeline parallelism; use d or FSDP"
            )
        add_adapters(module, adapters, seed=module.critic_head_seed)
    return Model(name, module, _tokenizer(tokenizer_path, path), device=device, dtype=module.dtype)


def make_null_model(
    name: ModelName,
    device: torch.device | str = "cpu",
    tokenizer_path: str | None = None,
    path: str | None = None,
) -> Model:
    """No module: what reward plugins run on (they only need the tokenizer to decode)."""
    return Model(name, None, _tokenizer(tokenizer_path, path), device=device)


register_model("real_model", make_real_model)
register_model("null", make_null_model)
