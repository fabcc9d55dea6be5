"""Projection weights prepared once per ``generate`` call for its decoding steps.

A decoding step multiplies a few rows (one per live sequence) by every projection of the model.
Three things are done once per call instead of once per step: the fused weights are concatenated
(``[q; k; v]``, ``[gate; up]``), cast to the activations' dtype (under autocast with fp32 master
weights, autocast would cast them again every step), and laid out [in, out], contiguous: for the
few rows of a decoding step ``x @ W_t`` is faster on CPU than ``F.linear`` on the [out, in]
weight (one thread, torch 2.13: 16 rows x 512 -> 512, 81 against 172 us; even at 256 rows).
Training and prefill never go through here: they rebuild the weights each call so that gradients
reach the parameters.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn


class DecodeWeights:
    """Prepared weights, keyed by the module they belong to (weakly: a module that is gone takes
    its entry with it, and a new module never finds another's)."""

    def __init__(self):
        self._prepared: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self._prepared)

    def linear(
        self,
        x: torch.Tensor,
        module: nn.Module,
        build: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
    ) -> torch.Tensor:
        """``x @ W.T + b`` for ``(W, b) = build()``, ``build`` called on ``module``'s first use only."""
        prepared = self._prepared.get(module)
        if prepared is None:
            w, b = build()
            dtype = _activation_dtype(w)
            prepared = (w.t().to(dtype).contiguous(), None if b is None else b.to(dtype))
            self._prepared[module] = prepared
        wt, b = prepared
        return x @ wt if b is None else torch.addmm(b, x, wt)


def _activation_dtype(w: torch.Tensor) -> torch.dtype:
    """autocast's dtype where it is on for ``w``'s device, else ``w``'s own."""
    device = w.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else w.dtype
