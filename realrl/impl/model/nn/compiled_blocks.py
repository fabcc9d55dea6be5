"""Transformer blocks run through ``torch.compile`` (Inductor fuses their elementwise work).

Each block is compiled, not the whole ``ReaLModel``: a packed batch's token count changes every
call, so the token dimension is dynamic and one set of graphs serves every batch. The same holds
for a pipeline stage's blocks and for blocks whose weights tensor parallelism or FSDP split.
What stays eager:

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


def call_block(layer: torch.nn.Module, x: torch.Tensor, rope, ctx, keep) -> torch.Tensor:
    """One block's forward: what runs eagerly, and what ``CompiledBlocks`` compiles."""
    return layer(x, rope, ctx, keep)


class CompiledBlocks:
    """One compiled entry point for every block of a model (a plain object, not a module: the
    model's state dict and parameters are unchanged)."""

    def __init__(self) -> None:
        # sizes are static but for the token dimension, marked dynamic at each call: with every
        # size symbolic (``dynamic=True``) Inductor fails on the sharding arithmetic of a block
        # whose weights are DTensors (tensor parallelism, FSDP)
        self._fn = torch.compile(call_block, dynamic=None)
        self.seconds = 0.0
        self._graphs_at_start = graph_count()

    @staticmethod
    def applies(ctx: Any) -> bool:
        """A packed forward without a KV cache (training, inference); prefill and decoding stay eager."""
        return getattr(ctx, "cache", None) is None and hasattr(ctx, "meta")

    def __call__(self, layer: torch.nn.Module, x: torch.Tensor, rope, ctx, keep) -> torch.Tensor:
        if x._base is not None:
            # a view (the local part of a DTensor: a vocabulary-split embedding's output under
            # tensor parallelism): AOTAutograd would send its gradient to the view's base and
            # past DTensor's own backward, which then receives a plain tensor; a copy cuts the alias
            x = x.clone()
        mark_token_dim(x, *(rope or ()), keep)
        shared = getattr(ctx, "shared", None)  # shared-prefix packing: maps between token counts
        if shared is not None:
            mark_token_dim(shared.expand, shared.represent)
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


def compile_blocks(module: torch.nn.Module) -> CompiledBlocks:
    """``module``'s blocks (a ``ReaLModel``'s or a pipeline stage's, each holding a
    ``compiled_blocks`` attribute) through ``torch.compile`` from now on."""
    if module.compiled_blocks is None:
        module.compiled_blocks = CompiledBlocks()
    return module.compiled_blocks


def block_runner(compiled: CompiledBlocks | None, ctx: Any):
    """What runs each block under ``ctx``: the compiled blocks where they apply, else the eager call."""
    return compiled if compiled is not None and compiled.applies(ctx) else call_block


def mark_token_dim(*tensors: torch.Tensor | None) -> None:
    """Dimension 0 (tokens, or rows kept) of each tensor varies from call to call: one graph for
    every count. Called on a block's inputs and on what its eager parts (attention, experts) hand
    back to the compiled code after a graph break. A dimension of one stays static (Dynamo
    specialises sizes 0 and 1), so a one-token call adds one graph."""
    for t in tensors:
        if t is not None and t.shape[0] > 1:
            torch._dynamo.maybe_mark_dynamic(t, 0)


def graph_count() -> int:
    """Graphs Dynamo has built in this process (its ``unique_graphs`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
