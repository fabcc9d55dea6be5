"""Rotary position embedding (HF "rotate_half" layout), with linear and llama3 frequency scaling."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def rotary_inv_freq(head_dim: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] in fp32, matching transformers' rope initialisers."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope scaling type {kind!r} is not supported (default, linear, llama3 are)")


class RotaryEmbedding(nn.Module):
    """cos/sin tables indexed by position, grown on demand (a cache, not a parameter)."""

    def __init__(self, head_dim: int, base: float, scaling: dict[str, Any] | None, device=None):
        super().__init__()
        self.register_buffer(
            "inv_freq", rotary_inv_freq(head_dim, base, scaling).to(device), persistent=False
        )
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def _grow(self, n: int) -> None:
        n = max(n, 256, 0 if self._cos is None else 2 * self._cos.shape[0])
        pos = torch.arange(n, device=self.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.float())
        # rotate_half(x) * sin == swap_halves(x) * [-sin, sin]: the sign lives in the table
        self._cos = torch.cat([freqs, freqs], dim=-1).cos()
        self._sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)

    def forward(
        self, positions: torch.Tensor, max_pos: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin of shape [T, 1, head_dim] for ``positions`` [T] (all < ``max_pos``)."""
        if self._cos is None or self._cos.shape[0] < max_pos or self._cos.device != self.inv_freq.device:
            self._grow(max_pos)
        return self._cos[positions].to(dtype).unsqueeze(1), self._sin[positions].to(dtype).unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by position: x * cos + rotate_half(x) * sin (HF layout), in 3 ops."""
    # swapping the halves is a roll by half: one op whose backward is one roll (a cat of two
    # slices backpropagates as two zero-filled copies and an add)
    swapped = x.roll(x.shape[-1] // 2, dims=-1)
    return torch.addcmul(x * cos, swapped, signed_sin)
