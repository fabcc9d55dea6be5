"""The registry of Hugging Face model families: how each architecture's ``config.json`` and
checkpoint convert to and from ReaLModel. The families themselves live in ``realrl.api.from_hf``,
one module each, registering themselves on import."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from realrl.api.core.model_api import ReaLModelConfig
from realrl.base.registry import Registry

if TYPE_CHECKING:  # tensors only in annotations here: the master imports this module without torch
    import torch


@dataclasses.dataclass(frozen=True)
class HFFamily:
    """How one Hugging Face architecture converts to and from ReaLModel (as in ReaL's documentation
    on customizing models).

    The state-dict converters must accept any subset of parameters so that a shard of a model
    can be loaded alone.
    """

    name: str
    hf_model_types: tuple[str, ...]
    config_from_hf: Callable[[Any], ReaLModelConfig]
    config_to_hf: Callable[[ReaLModelConfig], Any]
    sd_from_hf: Callable[[dict[str, torch.Tensor], ReaLModelConfig], dict[str, torch.Tensor]]
    sd_to_hf: Callable[[dict[str, torch.Tensor], ReaLModelConfig], dict[str, torch.Tensor]]
    embedding_param_names: Callable[[ReaLModelConfig], list[str]]
    tblock_param_names: Callable[[ReaLModelConfig, int], list[str]]
    head_param_names: Callable[[ReaLModelConfig], list[str]]


_HF_FAMILIES: Registry[HFFamily] = Registry("HF model family")


def register_hf_family(
    name: str,
    hf_model_types: str | tuple[str, ...],
    config_from_hf: Callable,
    config_to_hf: Callable,
    sd_from_hf: Callable,
    sd_to_hf: Callable,
    embedding_param_names: Callable,
    tblock_param_names: Callable,
    head_param_names: Callable,
) -> HFFamily:
    types = (hf_model_types,) if isinstance(hf_model_types, str) else tuple(hf_model_types)
    family = HFFamily(
        name,
        types,
        config_from_hf,
        config_to_hf,
        sd_from_hf,
        sd_to_hf,
        embedding_param_names,
        tblock_param_names,
        head_param_names,
    )
    return _HF_FAMILIES.register(name, family)


def get_hf_family(name: str) -> HFFamily:
    return _HF_FAMILIES.get(name)


def hf_family_for_model_type(model_type: str) -> HFFamily:
    """The family registered for a ``config.json`` ``model_type`` (e.g. "llama")."""
    for fam_name in _HF_FAMILIES.names():
        fam = _HF_FAMILIES.get(fam_name)
        if model_type in fam.hf_model_types:
            return fam
    known = sorted(t for n in _HF_FAMILIES.names() for t in _HF_FAMILIES.get(n).hf_model_types)
    raise LookupError(f"no HF family handles model_type {model_type!r}; supported: {known}")


def registered_hf_families() -> list[str]:
    return _HF_FAMILIES.names()
