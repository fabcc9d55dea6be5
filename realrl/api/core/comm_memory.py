"""Device memory the communication layer takes on a worker: a reallocation's staging buffers and
the NCCL communicators of the process groups it joins. Pure arithmetic on layouts and a
``ReaLModelConfig`` (no torch), for the memory plan.

Staging. A reallocation (``impl/model/comm/realloc.py``) packs what a worker sends each peer into
one device buffer and allocates one device buffer per peer it receives from, all alive at once;
so a worker holds the bytes it sends plus the bytes it receives, on top of the destination copy.
Which slice goes where is ReaL's plan (``impl/model/comm/realloc_plan.py``: each destination box
cut along the distinct source boxes, a piece taken from the destination itself when it holds that
box, else from the ``(destination rank % holders)``-th holder). That plan needs torch and the
module tree; here the same rule runs on groups of parameters that split alike, in fractions of a
tensor (a tp shard of ``m`` is ``1/m`` of its split dim, an FSDP shard ``1/d`` of its dim 0):
exact when every split divides evenly, as the tensor-parallel check requires of heads and inner
sizes. LoRA adapters (never split by tp) are spread evenly over the blocks.

Communicators. Every worker joins the default group, each mesh group ``impl/model/parallel/mesh.py``
creates for a placement it belongs to (the model group, its dp line and tp line; with pipeline
stages also its pp line, its replica's group and, on the first and last stage, the ends group of a
tied embedding) and each reallocation's group it takes part in (``system/model_worker.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from fractions import Fraction
from typing import TYPE_CHECKING

from realrl.api.core.layout import Placement
from realrl.api.core.model_api import ReaLModelConfig
from realrl.api.core.model_size import norm_params, stage_layers

if TYPE_CHECKING:
    from realrl.api.core.system_api import ExperimentConfig

MiB = 1024**2
# NCCL's documentation, "Environment Variables", NCCL_BUFFSIZE: the buffer used between a pair of
# ranks, per channel; default 4194304 bytes (4 MiB)
NCCL_BUFFSIZE = 4 * MiB
# channels per connection assumed: NCCL picks between NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS
# (same documentation) by topology; 2 is the floor NCCL keeps on one node with NVLink
NCCL_CHANNELS = 2
# a ring: each rank connects to its predecessor and its successor (one peer in a pair)
NCCL_RING_PEERS = 2

Interval = tuple[Fraction, Fraction]
Box = tuple[Interval, Interval, Interval]  # (expert axis, dim 0, dim 1) of a group's tensors
_WHOLE: Interval = (Fraction(0), Fraction(1))


@dataclasses.dataclass(frozen=True)
class Holding:
    """How one side of a move holds the model: its placement, FSDP over dp (dim 0), whole experts
    per tp rank (expert parallelism)."""

    placement: Placement
    fsdp: bool = False
    expert_parallel: bool = False


@dataclasses.dataclass(frozen=True)
class ParamGroup:
    """``count`` elements of parameters that split alike, each ``rows`` long in dim 0 (FSDP cuts
    that dim like ``torch.chunk``): ``split``, the dim tensor parallelism splits (None: whole on
    every tp rank); ``vocab``: split only when the vocabulary divides by tp; ``experts``: routed
    experts' weights (placed whole under expert parallelism); ``where``: a block's index, or
    "first", "last" or "tied" (the first and the last stage)."""

    count: int
    rows: int
    split: int | None
    where: int | str
    vocab: bool = False
    experts: bool = False


def _block_groups(cfg: ReaLModelConfig, i: int, adapters: int) -> list[ParamGroup]:
    """Block ``i``: q / k / v and gate / up split in dim 0, o and down in dim 1, the rest whole
    (``impl/model/parallel/tensor_parallel.py``'s plan)."""
    h, d = cfg.hidden_dim, cfg.head_dim
    q, kv = cfg.n_q_heads * d, cfg.n_kv_heads * d
    out = [
        ParamGroup(q * (h + cfg.use_attention_bias), q, 0, i),
        ParamGroup(2 * kv * (h + cfg.use_attention_bias), kv, 0, i),
        ParamGroup(h * q, h, 1, i),  # o
        ParamGroup(2 * norm_params(cfg) + h * cfg.use_attn_proj_bias, h, None, i),  # norms, o's bias
        ParamGroup(2 * d * cfg.qk_layernorm, d, None, i),
        ParamGroup(adapters, 1, None, i),  # LoRA (never split by tp), rows taken as 1
    ]
    if not cfg.is_moe_layer(i):
        inner, n_in = cfg.intermediate_dim, 2 if cfg.mlp_type == "gated" else 1  # gate and up, or up
        bias = cfg.use_mlp_bias
        return out + [
            ParamGroup(n_in * inner * (h + bias), inner, 0, i),
            ParamGroup(h * inner, h, 1, i),  # down
            ParamGroup(h * bias, h, None, i),  # down's bias
        ]
    e, inner, shared = cfg.n_experts, cfg.moe_intermediate_dim, cfg.shared_expert_intermediate_dim
    return out + [
        ParamGroup(e * h, e, None, i),  # the router
        ParamGroup(e * 2 * inner * h, inner, 0, i, experts=True),  # each expert's gate and up
        ParamGroup(e * h * inner, h, 1, i, experts=True),  # each expert's down
        ParamGroup(2 * shared * h, shared, 0, i),
        ParamGroup(h * shared, h, 1, i),
        ParamGroup(h * bool(shared), 1, None, i),  # the shared expert's one-output gate
    ]


def param_groups(cfg: ReaLModelConfig, adapter_params: int = 0) -> list[ParamGroup]:
    """Every parameter of a ReaLModel of ``cfg`` in groups that split alike (``adapter_params``:
    LoRA's, spread over the blocks)."""
    h, vocab = cfg.hidden_dim, cfg.vocab_size
    tied = cfg.tied_embedding and not cfg.is_critic
    out = [
        ParamGroup(vocab * h, vocab, 0, "tied" if tied else "first", vocab=True),
        ParamGroup(cfg.n_positions * h * cfg.abs_position_embedding, cfg.n_positions, None, "first"),
        ParamGroup(norm_params(cfg), h, None, "last"),
        ParamGroup((h + 1) * cfg.is_critic, 1, None, "last"),  # a critic's scalar head
    ]
    if not cfg.is_critic and not cfg.tied_embedding:
        out.append(ParamGroup(vocab * h, vocab, 0, "last", vocab=True))
    per_block, extra = divmod(adapter_params, max(cfg.n_layers, 1))
    for i in range(cfg.n_layers):
        out += _block_groups(cfg, i, per_block + (i < extra))
    return [g for g in out if g.count]


def _stages(where: int | str, blocks: list[range]) -> tuple[int, ...]:
    """The stages of ``blocks`` (each stage's blocks) that hold a group at ``where``."""
    if isinstance(where, int):
        return tuple(s for s, held in enumerate(blocks) if where in held)
    last = len(blocks) - 1
    return {"first": (0,), "last": (last,), "tied": (0, last)}[where]


def _blocks(cfg: ReaLModelConfig, pp: int) -> list[range]:
    return stage_layers(cfg, pp) if cfg.n_layers else [range(0)]


def _chunk(lo: int, hi: int, parts: int, index: int) -> tuple[int, int]:
    """Part ``index`` of ``parts`` of rows [lo, hi), cut like ``torch.chunk`` (``chunk_range``)."""
    n = hi - lo
    size = -(-n // parts)
    return lo + min(index * size, n), lo + min((index + 1) * size, n)


def _share(parts: int, index: int) -> Interval:
    return Fraction(index, parts), Fraction(index + 1, parts)


def _box(group: ParamGroup, stages: tuple[int, ...], side: Holding, rank: int, vocab: int) -> Box | None:
    """The part of ``group`` (on pipeline ``stages``) layout rank ``rank`` holds (None: nothing),
    as ``Side.box`` and ``shard_box`` cut a tensor: (experts, dim 0, dim 1) in fractions."""
    lay = side.placement.layout
    p, d, t = lay.coords(rank)
    if p not in stages:
        return None
    experts, rows, cols = _WHOLE, (0, group.rows), _WHOLE
    if group.experts and side.expert_parallel and lay.tp > 1:  # an equal share of whole experts
        experts = _share(lay.tp, t)
    elif lay.tp > 1 and group.split is not None and not (group.vocab and vocab % lay.tp):
        if group.split == 0:
            rows = _chunk(*rows, lay.tp, t)
        else:
            cols = _share(lay.tp, t)
    if side.fsdp and lay.dp > 1:
        rows = _chunk(*rows, lay.dp, d)
    return experts, (Fraction(rows[0], group.rows), Fraction(rows[1], group.rows)), cols


def _overlap(a: Box, b: Box) -> Fraction:
    return math.prod(max(Fraction(0), min(x1, y1) - max(x0, y0)) for (x0, x1), (y0, y1) in zip(a, b))


def staging_bytes(
    cfg: ReaLModelConfig, src: Holding, dst: Holding, itemsize: int, adapter_params: int = 0
) -> dict[int, int]:
    """Worker -> bytes of the send and receive buffers it holds while the model moves from
    ``src`` to ``dst`` in ``itemsize``-byte elements (the destination's dtype); workers with
    nothing to send or receive are absent."""
    src_blocks, dst_blocks = (_blocks(cfg, side.placement.layout.pp) for side in (src, dst))
    merged: Counter[tuple] = Counter()  # groups that split alike on the same stages move alike
    for g in param_groups(cfg, adapter_params):
        where = (_stages(g.where, src_blocks), _stages(g.where, dst_blocks))
        merged[(dataclasses.replace(g, count=0, where=0), *where)] += g.count
    moved: Counter[int] = Counter()
    for (group, src_stages, dst_stages), count in merged.items():
        holders: dict[Box, list[int]] = {}
        for rank, worker in enumerate(src.placement.workers):
            box = _box(group, src_stages, src, rank, cfg.vocab_size)
            if box is not None and _overlap(box, box):
                holders.setdefault(box, []).append(worker)
        for rank, worker in enumerate(dst.placement.workers):
            target = _box(group, dst_stages, dst, rank, cfg.vocab_size)
            for box, workers in () if target is None else holders.items():
                share = _overlap(target, box)
                candidates = sorted(workers)
                sender = worker if worker in candidates else candidates[rank % len(candidates)]
                if share and sender != worker:
                    moved[sender] += share * count * itemsize
                    moved[worker] += share * count * itemsize
    return {w: math.ceil(n) for w, n in moved.items()}


def communicator_bytes(size: int) -> int:
    """NCCL's buffers on one rank of a communicator of ``size`` ranks (none for one rank)."""
    return NCCL_BUFFSIZE * NCCL_CHANNELS * min(size - 1, NCCL_RING_PEERS)


def mesh_group_sizes(placement: Placement, worker: int) -> list[int]:
    """The sizes of the groups ``impl/model/parallel/mesh.py`` creates for ``placement`` that
    ``worker`` belongs to (none for a placement of one rank, or one without ``worker``)."""
    lay = placement.layout
    if lay.world_size == 1 or worker not in placement.workers:
        return []
    stage = placement.coords_of(worker)[0]
    sizes = [lay.world_size, lay.dp, lay.tp]  # the model group, this rank's dp and tp lines
    if lay.pp > 1:
        sizes += [lay.pp, lay.pp * lay.tp]  # its pp line, its replica's every stage
        sizes += [2] if stage in (0, lay.pp - 1) else []  # the first and last stage: a tied embedding
    return sizes


def communicator_sizes(exp: ExperimentConfig, worker: int) -> list[int]:
    """The size of every process group ``worker`` joins: the default group, its meshes' groups
    (every placement a model is laid out in) and the reallocations it takes part in."""
    sizes = [exp.n_model_workers]
    for placement in exp.mesh_placements().values():
        sizes += mesh_group_sizes(placement, worker)
    return sizes + [len(group) for group in exp.realloc_groups() if worker in group]
