"""Layer norms: RMSNorm (llama family) and LayerNorm (GPT-2)."""

from __future__ import annotations

import torch
from torch import nn

from realrl.impl.model import kernels


class RMSNorm(nn.Module):
    """Normalises in fp32 and casts back before the weight, as the HF llama family does. The output
    has the input's dtype, like ``nn.LayerNorm`` under autocast: bf16 rows stay bf16 next to fp32
    master weights (``kernels.rms_norm``)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)


def make_norm(kind: str, dim: int, eps: float, dtype=None, device=None) -> nn.Module:
    if kind == "rms":
        return RMSNorm(dim, eps, dtype=dtype, device=device)
    if kind == "layer":
        return nn.LayerNorm(dim, eps=eps, dtype=dtype, device=device)
    raise ValueError(f"unknown layer_norm_type {kind!r}; expected 'rms' or 'layer'")
