"""Transformer blocks run through ``torch.compile`` (Inductor fuses their elementwise work).

Each block is compiled, not the whole ``ReaLModel``: a packed batch's token count changes every
call, so the token dimension is dynamic and one set of graphs serves every batch. What stays eager:

- the attention itself (``PackedContext.attend``: the ``cpu_varlen`` C kernel, the CUDA varlen
  kernels, SDPA), behind a graph break (``transformer_block.eager_attend``), so results stay exact;
- no C or Triton kernel is called inside the compiled region (``kernels.use_native`` and
  ``use_triton`` say no while Dynamo traces): there RMSNorm runs its torch expression, which
  Inductor fuses with its neighbours;
- decoding and prefill (a context holding a KV cache) run the eager blocks in this version.

``CompiledBlocks.stats()`` says how many graphs Dynamo built in this process and how long the
calls that built them took (``compile/graphs``, ``compile/seconds``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

# graphs a model's blocks compile into per mode (training, inference), whatever its number of
# layers (the index is read outside the traced code) or its batches' token counts (dynamic):
# before and after the attention's graph break, the last layer's variant; within Dynamo's limit
GRAPH_BOUND = 8


def _run_block(layer: torch.nn.Module, x: torch.Tensor, rope, ctx, keep):
    return layer(x, rope, ctx, keep)


class CompiledBlocks:
    """One compiled entry point for every block of a model (a plain object, not a module: the
    model's state dict and parameters are unchanged)."""

    def __init__(self, dynamic: bool = True) -> None:
        self._fn = torch.compile(_run_block, dynamic=dynamic)
        self.seconds = 0.0
        self._graphs_at_start = graph_count()

    @staticmethod
    def applies(ctx: Any) -> bool:
        """A packed forward without a KV cache (training, inference); prefill and decoding stay eager."""
        return getattr(ctx, "cache", None) is None and hasattr(ctx, "meta")

    def __call__(self, layer: torch.nn.Module, x: torch.Tensor, rope, ctx, keep) -> torch.Tensor:
        before = graph_count()
        start = time.perf_counter()
        out = self._fn(layer, x, rope, ctx, keep)
        if graph_count() != before:  # this call compiled: its time is (almost all) compilation
            self.seconds += time.perf_counter() - start
        return out

    def stats(self) -> dict[str, float]:
        return {
            "compile/graphs": float(graph_count() - self._graphs_at_start),
            "compile/seconds": self.seconds,
        }


def graph_count() -> int:
    """Graphs Dynamo has built in this process (its ``unique_graphs`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
