"""Tensor parallelism of ReaLModel with DTensor (Megatron-LM's split, torch's parallel styles).

Per block, the query/key/value projections and the MLP's gate/up projections are column-wise
(each rank computes its own heads and its slice of the inner dimension, no communication); the
attention output and the MLP's down projection are row-wise (one all-reduce each). The token
embedding is split over the vocabulary (row-wise, an all-reduce) and the LM head column-wise
with its logits gathered, when the vocabulary divides evenly; norms, learned positions and a
critic's scalar head stay whole on every rank. The same plan serves every family (llama, qwen2,
qwen3, mistral, gpt2): they differ in biases, norms and MLP kind, not in what splits.

A Mixture-of-Experts block splits each expert (and the shared expert) like the dense MLP, its
router and shared gate whole; or, with expert parallelism (``<role>.engine.expert_parallel``),
each rank keeps whole experts, an equal contiguous share of them, under their own names. Either
way the block computes this rank's part of its output and reduces it once (``nn/moe.py``).

Activations between blocks are whole on every rank (no sequence parallelism): packed,
variable-length batches then need no change anywhere else, and the KV cache of generation holds
each rank's own KV heads. The one whole weight that meets split activations is qwen3's per-head
q/k norm: each rank sees only its heads, so its gradient is summed over the tp ranks (see
``SumGradientOverTp`` for how that sum survives FSDP and checkpoint loading).
"""

from __future__ import annotations

import functools
import re

import torch
import torch.distributed as dist
import torch.utils.weak
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from realrl.api.core.layout_fit import check_tensor_parallel
from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.nn.moe import ExpertSplit
from realrl.impl.model.parallel.partial_sum import all_reduced

_EXPERT = re.compile(r"(?:^|\.)mlp\.experts\.(\d+)\.")  # a routed expert's parameter


def splits_vocab(cfg: ReaLModelConfig, tp: int) -> bool:
    return cfg.vocab_size % tp == 0


def _expert(plan: dict[str, ParallelStyle], name: str) -> None:
    """An expert split like the dense MLP (gate/up column-wise, down row-wise), but its down
    projection's output stays this rank's summand (a DTensor partial over "tp"): the block adds
    the parts up once (``nn/moe.py``), not once per expert."""
    plan[f"{name}.gate"] = ColwiseParallel()
    plan[f"{name}.up"] = ColwiseParallel()
    plan[f"{name}.down"] = RowwiseParallel(output_layouts=Partial(), use_local_output=False)


def plan_for(cfg: ReaLModelConfig, tp: int, expert_parallel: bool = False) -> dict[str, ParallelStyle]:
    """Module name -> parallel style. A sparse block's experts are split like the dense MLP, or,
    with ``expert_parallel``, not at all (``expert_range`` places them whole); its router and
    shared gate stay whole (they read whole activations)."""
    plan: dict[str, ParallelStyle] = {}
    if splits_vocab(cfg, tp):
        plan["embed.wte"] = RowwiseParallel(input_layouts=Replicate())
        if not cfg.is_critic:
            plan["head"] = ColwiseParallel(output_layouts=Replicate())
    for i in range(cfg.n_layers):
        block = f"layers.{i}"
        for name in ("q", "k", "v"):
            plan[f"{block}.attn.{name}"] = ColwiseParallel()
        plan[f"{block}.attn.o"] = RowwiseParallel()
        if cfg.is_moe_layer(i):
            if not expert_parallel:
                for e in range(cfg.n_experts):
                    _expert(plan, f"{block}.mlp.experts.{e}")
            if cfg.shared_expert_intermediate_dim:
                _expert(plan, f"{block}.mlp.shared")
            continue
        if cfg.mlp_type == "gated":
            plan[f"{block}.mlp.gate"] = ColwiseParallel()
        plan[f"{block}.mlp.up"] = ColwiseParallel()
        plan[f"{block}.mlp.down"] = RowwiseParallel()
    return plan


def numbered_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(index in the whole model, block) of every block ``model`` holds: all of a ReaLModel's, or a
    pipeline stage's (``parallel/pipeline.py``), whose blocks are keyed by that index."""
    if isinstance(model.layers, nn.ModuleDict):
        return [(int(i), layer) for i, layer in model.layers.items()]
    return list(enumerate(model.layers))


def _holds(model: nn.Module, name: str) -> bool:
    """Whether ``model`` has the submodule ``name`` (a pipeline stage holds some blocks only)."""
    try:
        return model.get_submodule(name) is not None
    except AttributeError:
        return False


def expert_range(n_experts: int, tp: int, rank: int) -> range:
    """The experts tp rank ``rank`` holds whole under expert parallelism: an equal, contiguous share."""
    share = n_experts // tp
    return range(rank * share, (rank + 1) * share)


def expert_owner(name: str, n_experts: int, tp: int) -> int | None:
    """The tp rank that holds parameter ``name`` under expert parallelism (None: a parameter of
    every rank, not a routed expert's)."""
    match = _EXPERT.search(name)
    return None if match is None else int(match.group(1)) // (n_experts // tp)


def partial_over_tp(attn: nn.Module) -> list[nn.Parameter]:
    """The whole weights of an attention module that see only this rank's heads: its per-head
    q/k norms (qwen3). Read at call time: the parameters that are in the module now."""
    norms = (getattr(attn, "q_ln", None), getattr(attn, "k_ln", None))
    return [p for norm in norms if norm is not None for p in norm.parameters()]


class SumGradientOverTp:
    """Forward pre-hook of an attention module: before each forward that records gradients, the
    ``partial_over_tp`` weights it is about to read get a gradient hook that sums their gradient
    over the tp ranks (once per tensor).

    A hook on the parameters at split time would not do: what wraps the module afterwards
    replaces them. FSDP2's ``fully_shard`` swaps in sharded parameters, and during forward and
    backward an unsharded one autograd accumulates into; loading a checkpoint split allocates
    with ``to_empty``, which makes new parameters. The module stays, and the weight it reads in
    forward is the one autograd differentiates, so the sum lands on each backward's own
    contribution, before accumulation over micro-batches and before FSDP's reduce-scatter over
    "dp" (both sums, so their order does not matter). A post-accumulate hook would sum the
    accumulated gradient again at every micro-batch; replicated DTensor weights would hand the
    optimizer and the norm clipping partial gradients outside FSDP and route every norm of
    decoding through DTensor dispatch.
    """

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.hooked = torch.utils.weak.WeakIdKeyDictionary()  # the tensors given the hook

    def __call__(self, attn: nn.Module, args: tuple) -> None:
        if not torch.is_grad_enabled():  # no backward will reach this forward's weights
            return
        for p in partial_over_tp(attn):
            if p.requires_grad and p not in self.hooked:
                # a whole weight's gradient from this rank's heads, summed over the tp ranks' heads
                p.register_hook(functools.partial(all_reduced, group=self.group))
                self.hooked[p] = True


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, expert_parallel: bool = False) -> None:
    """Shard ``model`` (a ReaLModel, whole and identical on every rank, or on "meta") over
    ``tp_mesh`` in place.

    Each rank keeps its slice of the weights it already holds (no communication). The attention
    modules are told how many heads are theirs, the sparse blocks how they are split;
    ``expert_parallel``: each sparse block keeps its own whole experts and drops the others.
    """
    cfg: ReaLModelConfig = model.config
    tp = tp_mesh.size()
    check_tensor_parallel(cfg, tp, "tensor parallelism", expert_parallel)
    plan = {name: style for name, style in plan_for(cfg, tp, expert_parallel).items() if _holds(model, name)}
    parallelize_module(model, tp_mesh, plan, src_data_rank=None)
    group = tp_mesh.get_group()
    for i, layer in numbered_blocks(model):
        layer.attn.n_q, layer.attn.n_kv = cfg.n_q_heads // tp, cfg.n_kv_heads // tp
        if partial_over_tp(layer.attn):
            layer.attn.register_forward_pre_hook(SumGradientOverTp(group))
        if cfg.is_moe_layer(i):
            layer.mlp.split = ExpertSplit(group, whole_experts=expert_parallel)
            if expert_parallel:
                layer.mlp.keep_experts(expert_range(cfg.n_experts, tp, tp_mesh.get_local_rank()))
    if cfg.tied_embedding and not cfg.is_critic and model.embed is not None and model.head is not None:
        model.head.weight = model.embed.wte.weight  # both split the vocabulary the same way
