"""Gradient (activation) checkpointing: recompute each block's activations during backward.

A module that offers ``gradient_checkpointing_enable()`` (HF models, or any module with its own
switch) is asked to do it. Otherwise, when the module exposes its transformer blocks as an
``nn.ModuleList`` named ``layers`` (ReaLModel does), each block is wrapped in PyTorch's
``CheckpointWrapper`` (non-reentrant ``torch.utils.checkpoint``, RNG state preserved so dropout
masks are recomputed identically). The wrapper's state-dict hooks strip its prefix, so
``state_dict()``, ``save_pretrained`` and checkpoints keep the module's own parameter names.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
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
    if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
        for i, block in enumerate(layers):
            if not isinstance(block, CheckpointWrapper):
                layers[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        return "layers"
    raise ValueError(
        f"EngineConfig.gradient_checkpointing=True but {type(module).__name__} offers neither "
        "gradient_checkpointing_enable() nor its blocks as an nn.ModuleList named 'layers'"
    )
