"""Gradient (activation) checkpointing: recompute each block's activations during backward.

A module that offers ``gradient_checkpointing_enable()`` (HF models, or any module with its own
switch) is asked to do it. Otherwise, when the module exposes its transformer blocks as an
``nn.ModuleList`` or ``nn.ModuleDict`` named ``layers`` (ReaLModel, a pipeline stage), each block is wrapped in PyTorch's
``CheckpointWrapper`` (non-reentrant ``torch.utils.checkpoint``, RNG state preserved so dropout
masks are recomputed identically). The wrapper's state-dict hooks strip its prefix, so
``state_dict()``, ``save_pretrained`` and checkpoints keep the module's own parameter names;
``named_parameters()`` does not, so code that looks parameters up by name (a parameter
reallocation) goes through ``own_named_parameters``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_PREFIX,
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)


def enable_gradient_checkpointing(module: torch.nn.Module) -> str:
    """Turn checkpointing on; return how ("module" or "layers"). Raises if neither applies."""
    if hasattr(module, "gradient_checkpointing_enable"):
        module.gradient_checkpointing_enable()
        return "module"
    layers = getattr(module, "layers", None)
    if isinstance(layers, torch.nn.ModuleList | torch.nn.ModuleDict) and len(layers) > 0:
        keys = list(layers.keys()) if isinstance(layers, torch.nn.ModuleDict) else range(len(layers))
        for key in keys:
            if not isinstance(layers[key], CheckpointWrapper):
                layers[key] = checkpoint_wrapper(layers[key], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        return "layers"
    raise ValueError(
        f"EngineConfig.gradient_checkpointing=True but {type(module).__name__} offers neither "
        "gradient_checkpointing_enable() nor its blocks as an nn.ModuleList (or ModuleDict) named 'layers'"
    )


def own_named_parameters(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """``module.named_parameters()`` under the module's own names: without the prefix each
    ``CheckpointWrapper`` adds, as the wrapper's state-dict hook strips it."""
    for name, param in module.named_parameters():
        yield name.replace(_CHECKPOINT_PREFIX, ""), param
