"""Feed-forward blocks: gated (llama: down(act(gate x) * up x)) and plain (GPT-2: down(act(up x)))."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str):
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation_function {name!r}; supported: {sorted(_ACTIVATIONS)}") from None


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int, gated: bool, act: str, bias: bool, dtype=None, device=None):
        super().__init__()
        kw = dict(bias=bias, dtype=dtype, device=device)
        self.gated = gated
        self.act = activation(act)
        if gated:
            self.gate = nn.Linear(hidden, inner, **kw)
        self.up = nn.Linear(hidden, inner, **kw)
        self.down = nn.Linear(inner, hidden, **kw)

    def fused_gate_up(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[gate; up] as one projection (gated MLPs only)."""
        w = torch.cat([self.gate.weight, self.up.weight])
        b = None if self.up.bias is None else torch.cat([self.gate.bias, self.up.bias])
        return w, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))
