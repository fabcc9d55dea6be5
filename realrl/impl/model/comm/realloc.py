"""Parameter reallocation on the workers: carry out a ``ReallocPlan`` with point-to-point messages.

Each worker packs what it sends one destination into one flat buffer, posts every send and
receive at once on the group of the reallocation's own workers (never the default group: with
NCCL a batch of messages uses its group's communicator, whose creation needs every member, and
the workers outside the move are busy elsewhere), copies the pieces it keeps locally meanwhile,
and scatters what it receives into the destination's local shards. Every wait is bounded: a
peer that never shows up gives an error, not a hang. As in "ReaL: Efficient RLHF Training of
Large Language Models with Parameter Reallocation" (MLSys 2025), nothing is gathered whole on
any worker; the gather-then-broadcast baseline it is measured against is in ``baseline.py``.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from realrl.api.core.layout import Placement
from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.backend.activation_checkpointing import own_named_parameters
from realrl.impl.model.comm.realloc_plan import (
    Box,
    ParamSpec,
    Piece,
    ReallocPlan,
    Side,
    is_empty,
)
from realrl.impl.model.nn.lora import LoRAConfig, add_adapters, trained_param_names
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.parallel.dtensor import local
from realrl.impl.model.parallel.mesh import ParallelContext, comm_device

Tensors = dict[str, torch.Tensor]


# ---------------------------------------------------------------- how a layout holds the model


def _style_dims(style: object, module: nn.Module) -> dict[str, int | None]:
    """The dim each parameter of ``module`` is split along by a torch parallel style."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if not isinstance(style, ColwiseParallel | RowwiseParallel) or not isinstance(
        module, nn.Linear | nn.Embedding
    ):
        raise ValueError(f"no split rule for {type(style).__name__} on {type(module).__name__}")
    col = isinstance(style, ColwiseParallel)
    if isinstance(module, nn.Embedding):  # weight [vocab, hidden]: row-wise splits the vocabulary
        return {"weight": 1 if col else 0}
    if col:
        return {"weight": 0, "bias": 0}
    return {"weight": 1, "bias": None}  # row-wise: the bias is added once, after the all-reduce


def _meta_model(cfg: ReaLModelConfig, lora: LoRAConfig | None = None) -> ReaLModel:
    """The model's structure without values (parameter names, shapes, module kinds), with its
    LoRA adapters when it has them."""
    with torch.random.fork_rng(devices=[]):  # the model draws a critic-head seed: the caller's RNG stays
        model = ReaLModel(cfg, device="meta")
        if lora is not None:
            add_adapters(model, lora)
    return model


def split_dims_for(
    cfg: ReaLModelConfig, tp: int, lora: LoRAConfig | None = None, expert_parallel: bool = False
) -> dict[str, int | None]:
    """Parameter -> the dim tensor parallelism over ``tp`` ranks splits (None: whole), read from
    the same plan ``apply_tensor_parallel`` applies. Depends on ``tp``: the vocabulary splits only
    when it divides."""
    from realrl.impl.model.parallel.tensor_parallel import plan_for

    model = _meta_model(cfg, lora)
    # named_parameters: a tied head is the embedding's weight, under the embedding's name only
    dims: dict[str, int | None] = {n: None for n, _ in model.named_parameters()}
    if tp == 1:
        return dims
    for module_name, style in plan_for(cfg, tp, expert_parallel).items():
        module = model.get_submodule(module_name)
        for attr, dim in _style_dims(style, module).items():
            if getattr(module, attr, None) is not None and f"{module_name}.{attr}" in dims:
                dims[f"{module_name}.{attr}"] = dim
    return dims


def side_for(
    cfg: ReaLModelConfig,
    placement: Placement,
    fsdp: bool = False,
    lora: LoRAConfig | None = None,
    expert_parallel: bool = False,
) -> Side:
    """The plan's view of ``cfg`` laid out on ``placement`` (``fsdp``: as ``apply_fsdp`` shards;
    ``expert_parallel``: each tp rank holds its share of the routed experts whole; pipeline
    stages: each holds its own layers)."""
    from realrl.impl.model.parallel.pipeline import param_stages
    from realrl.impl.model.parallel.tensor_parallel import expert_owner

    tp, pp = placement.layout.tp, placement.layout.pp
    dims = split_dims_for(cfg, tp, lora, expert_parallel)
    owners = {}
    if expert_parallel and tp > 1:
        owned = ((n, expert_owner(n, cfg.n_experts, tp)) for n in dims)
        owners = {n: owner for n, owner in owned if owner is not None}
    stages = param_stages(cfg, list(dims), pp) if pp > 1 else {}
    return Side(placement, dims, fsdp and placement.layout.dp > 1, owners, stages)


def param_specs(module: nn.Module, wire_dtype: torch.dtype | None = None) -> dict[str, ParamSpec]:
    """Every parameter's whole shape (a DTensor's ``shape`` is global) and the dtype it travels in
    (``wire_dtype``, default its own). All workers must plan from equal specs: a worker outside
    the destination passes the destination's dtype."""
    return {n: ParamSpec(tuple(p.shape), wire_dtype or p.dtype) for n, p in own_named_parameters(module)}


def model_param_specs(
    cfg: ReaLModelConfig, wire_dtype: torch.dtype, lora: LoRAConfig | None = None, trained_only: bool = False
) -> dict[str, ParamSpec]:
    """``param_specs`` of a ReaLModel of ``cfg`` (with ``lora``'s adapters) without building one:
    what a worker that holds neither side yet (or holds them in another dtype) plans with.
    ``trained_only``: the adapters (and a critic's head) alone, for a copy that holds the base."""
    specs = param_specs(_meta_model(cfg, lora), wire_dtype)
    if trained_only:
        specs = {n: specs[n] for n in trained_param_names(list(specs), cfg.is_critic)}
    return specs


# ---------------------------------------------------------------- an empty model for a layout


def build_copy(
    cfg: ReaLModelConfig,
    parallel: ParallelContext | None,
    device: torch.device | str,
    dtype: torch.dtype,
    attn_impl: str = "auto",
    lora: LoRAConfig | None = None,
) -> nn.Module:
    """An empty ReaLModel laid out for ``parallel``, to be filled by ``reallocate``: this rank's
    pipeline stage when pp > 1, split by tensor parallelism when tp > 1 (whole experts per rank
    with ``parallel.expert_parallel``), never sharded by FSDP (a copy serves generation and
    inference), in eval mode and without gradients. Only this worker's shards are allocated."""
    from realrl.impl.model.parallel.pipeline import PipelineStage
    from realrl.impl.model.parallel.tensor_parallel import apply_tensor_parallel

    with torch.random.fork_rng(devices=[]):  # weights come from the source; the caller's RNG stays
        model = ReaLModel(cfg, dtype=dtype, device="meta", attn_impl=attn_impl)
        if lora is not None:  # the same adapters as the home model (names, shapes): filled from it
            add_adapters(model, lora)
    if parallel is not None and parallel.layout.pp > 1:
        model = PipelineStage.of(model, parallel.stage, parallel.layout.pp)
    if parallel is not None and parallel.mesh is not None and parallel.layout.tp > 1:
        apply_tensor_parallel(model, parallel.tp_mesh, parallel.expert_parallel)
    model.materialize(device)
    return model.eval().requires_grad_(False)


# ---------------------------------------------------------------- moving the pieces


@dataclasses.dataclass
class ReallocStats:
    bytes_sent: int
    bytes_received: int
    seconds: float


def _slices(box: Box, within: Box) -> tuple[slice, ...]:
    """``box`` as an index into the local tensor that holds ``within``."""
    return tuple(slice(lo - start, hi - start) for (lo, hi), (start, _) in zip(box, within, strict=True))


def _shape(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


def _message(plan: ReallocPlan, src: int, dst: int) -> list[tuple[Piece, int, int]]:
    """(piece, byte offset, bytes) of one pair's buffer: plan order, wider dtypes first, so every
    slice starts at a multiple of its item size and views the bytes in place."""
    pieces = sorted(plan.between(src, dst), key=lambda p: -plan.params[p.param].itemsize)
    out, offset = [], 0
    for piece in pieces:
        n = plan.piece_bytes(piece)
        out.append((piece, offset, n))
        offset += n
    return out


def _view(buf: torch.Tensor, spec: ParamSpec, piece: Piece, offset: int, n: int) -> torch.Tensor:
    return buf[offset : offset + n].view(spec.dtype).view(_shape(piece.box))


def local_tensors(
    module: nn.Module | None, boxes: Mapping[str, Mapping[int, Box]], me: int, what: str
) -> Tensors:
    """This worker's local tensor of every planned parameter, checked against its planned box
    (names as the module's own: a gradient-checkpointed source is found under them too). A
    parameter another rank holds alone (an expert placed elsewhere: an empty box) may be absent."""
    if module is None:
        raise ValueError(f"worker {me} is in the {what} placement of the plan but has no {what} module")
    named = dict(own_named_parameters(module))
    if getattr(module, "tied", False) and "embed.wte.weight" not in named:  # a last pipeline stage
        named["embed.wte.weight"] = named.pop("head.weight")  # its copy of the tied embedding
    out = {}
    for name, per_worker in boxes.items():
        if name not in named and is_empty(per_worker[me]):
            continue
        if name not in named:
            raise ValueError(f"the {what} module has no parameter {name!r}")
        t, expected = local(named[name]), _shape(per_worker[me])
        if tuple(t.shape) != expected:
            raise ValueError(
                f"{what} parameter {name!r} on worker {me}: local tensor of shape {tuple(t.shape)}, "
                f"but the plan's box {per_worker[me]} has shape {expected}"
            )
        out[name] = t
    return out


def reshard_fsdp(module: nn.Module) -> None:
    """FSDP2 keeps the root unit's parameters gathered after a forward (nothing else would free
    them before the next backward); the plan describes shards, so every unit is resharded
    first: it frees the gathered copies, without any communication."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


def _wire(group: dist.ProcessGroup | None) -> tuple[torch.device, bool]:
    """Where the buffers live and whether messages are batched, decided from ``group`` alone, so
    every member decides alike (a member whose weights sit in host memory, an offloaded model,
    must not choose gloo while its peers wait on NCCL): with NCCL (every worker owns its GPU) the
    buffers are on this worker's GPU and sends and receives are posted as one batch, so that two
    peers sending each other first do not wait for each other; otherwise they go through host
    memory for gloo."""
    device = comm_device(group if group is not None else dist.group.WORLD)
    return device, device.type == "cuda"


def _batch(ops: list[tuple[Callable, torch.Tensor, int, int]], group: dist.ProcessGroup | None) -> list:
    """``ops`` as one ``batch_isend_irecv`` (peers: global ranks): one NCCL group call and one
    work for all, or under gloo one message and one work each."""
    if not ops:
        return []
    return dist.batch_isend_irecv([dist.P2POp(fn, t, peer, group=group, tag=tag) for fn, t, peer, tag in ops])


def _post(
    ops: list[tuple[Callable, torch.Tensor, int, int]],
    group: dist.ProcessGroup | None,
    device: torch.device,
    batched: bool,
) -> list[dist.Work]:
    """Post every message of a reallocation on ``group``. A batch uses the group's NCCL
    communicator, created by its first use with every member present: all of them take part in
    one all-reduce on the device first (which, unlike a barrier on a mixed gloo/NCCL group, goes
    to NCCL on every torch version), also those with nothing to send or receive."""
    if batched:
        dist.all_reduce(torch.zeros(1, device=device), group=group)
        return _batch(ops, group)
    return [fn(t, peer, group=group, tag=tag) for fn, t, peer, tag in ops]


def _send_ops(plan: ReallocPlan, me: int, src: Mapping[str, torch.Tensor], device, first_tag: int) -> list:
    """One packed buffer per destination of ``me``: its sends."""
    ops = []
    for _, peer in (p for p in plan.pairs() if p[0] == me):
        message = _message(plan, me, peer)
        buf = torch.empty(sum(n for *_, n in message), dtype=torch.uint8, device=device)
        for piece, offset, n in message:
            held = plan.src_boxes[piece.param][me]
            _view(buf, plan.params[piece.param], piece, offset, n).copy_(
                src[piece.param][_slices(piece.box, held)]
            )
        ops.append((dist.isend, buf, peer, first_tag + plan.tag(me, peer)))
    return ops


def _receive_ops(plan: ReallocPlan, me: int, device, first_tag: int) -> tuple[list, list]:
    """One buffer per source of ``me``: its receives, and (buffer, message) to scatter after."""
    ops, received = [], []
    for peer, _ in (p for p in plan.pairs() if p[1] == me):
        message = _message(plan, peer, me)
        buf = torch.empty(sum(n for *_, n in message), dtype=torch.uint8, device=device)
        ops.append((dist.irecv, buf, peer, first_tag + plan.tag(peer, me)))
        received.append((buf, message))
    return ops, received


def _scatter(plan: ReallocPlan, me: int, received: list, dst: Mapping[str, torch.Tensor]) -> None:
    for buf, message in received:
        for piece, offset, n in message:
            into = plan.dst_boxes[piece.param][me]
            dst[piece.param][_slices(piece.box, into)].copy_(
                _view(buf, plan.params[piece.param], piece, offset, n)
            )


@torch.no_grad()
def move(
    plan: ReallocPlan,
    me: int,
    src: Mapping[str, torch.Tensor] | None,
    dst: Mapping[str, torch.Tensor] | None,
    timeout_s: float,
    first_tag: int = 0,
    group: dist.ProcessGroup | None = None,
) -> ReallocStats:
    """Carry out ``plan`` on worker ``me``, from and into local tensors (name -> the tensor holding
    this worker's box; None where ``me`` holds no box on that side). Messages go over ``group``
    (None: the default group), every member of which calls ``move`` with the same plan."""
    start = time.perf_counter()
    pairs = plan.pairs()
    device, batched = _wire(group)
    ops = _send_ops(plan, me, src, device, first_tag) if src is not None else []
    receives, received = _receive_ops(plan, me, device, first_tag)
    ops += receives
    works = _post(ops, group, device, batched)
    for piece in plan.between(me, me):  # what this worker keeps, while the messages travel
        into = plan.dst_boxes[piece.param][me]
        held = plan.src_boxes[piece.param][me]
        dst[piece.param][_slices(piece.box, into)].copy_(src[piece.param][_slices(piece.box, held)])
    _wait(works, me, pairs, timeout_s, time.monotonic() + timeout_s)
    _scatter(plan, me, received, dst)
    sent = sum(t.numel() for fn, t, *_ in ops if fn is dist.isend)
    got = sum(buf.numel() for buf, _ in received)
    return ReallocStats(sent, got, time.perf_counter() - start)


def _halves_possible(plan: ReallocPlan, group: dist.ProcessGroup | None) -> torch.device:
    """Pushes (a send half now, its receive half later) need source and destination on different
    workers: a worker on both sides would wait for its own receive. Where the buffers live."""
    if set(plan.src_workers) & set(plan.dst_workers):
        raise ValueError(
            f"a weight push needs disjoint workers: {sorted(plan.src_workers)} -> {sorted(plan.dst_workers)}"
        )
    return _wire(group)[0]


@torch.no_grad()
def post_sends(
    plan: ReallocPlan,
    me: int,
    src_module: nn.Module,
    first_tag: int,
    *,
    group: dist.ProcessGroup,
) -> list[tuple[dist.Work, torch.Tensor, int]]:
    """The send half of ``plan`` on source worker ``me`` (a weight push): one message per
    destination, posted as one batch on ``group`` (GPU buffers under NCCL, host ones under gloo),
    waited for by nobody: the caller keeps each (work, buffer, peer) until the work completes.
    No all-reduce first (the destinations are busy elsewhere): the group's communicator must
    exist, created by a reallocation (the caller checks). NCCL matches a pair's messages in
    order: the destinations receive the pushes in the order they were posted."""
    device = _halves_possible(plan, group)
    reshard_fsdp(src_module)
    src = local_tensors(src_module, plan.src_boxes, me, "source")
    # On CUDA the pack runs on the current stream and NCCL's stream waits for it by an event,
    # never by a host sync: a destination not there yet stalls only that NCCL stream, not this
    # host nor its compute stream (under gloo the sends progress on gloo's own threads).
    ops = _send_ops(plan, me, src, device, first_tag)
    works = _batch(ops, group)
    works = works * len(ops) if len(works) == 1 else works  # NCCL's one work completes them all
    return [(w, buf, peer) for w, (_, buf, peer, _) in zip(works, ops, strict=True)]


@torch.no_grad()
def receive(
    plan: ReallocPlan,
    me: int,
    dst_module: nn.Module,
    timeout_s: float,
    first_tag: int,
    *,
    group: dist.ProcessGroup,
) -> ReallocStats:
    """The receive half of ``plan`` on destination worker ``me``: what the sources posted with
    ``post_sends`` lands in ``dst_module``: one message per source, one batch, no all-reduce."""
    start = time.perf_counter()
    device = _halves_possible(plan, group)
    dst = local_tensors(dst_module, plan.dst_boxes, me, "destination")
    ops, received = _receive_ops(plan, me, device, first_tag)
    works = _batch(ops, group)
    _wait(works, me, plan.pairs(), timeout_s, time.monotonic() + timeout_s)
    _scatter(plan, me, received, dst)
    return ReallocStats(0, sum(buf.numel() for buf, _ in received), time.perf_counter() - start)


def _wait(
    works: list[dist.Work], me: int, pairs: list[tuple[int, int]], timeout_s: float, deadline: float
) -> None:
    """Every message done before ``deadline``, else an error naming this worker's peers."""
    for work in works:
        # at least 1 ms: gloo reads a zero timeout as "no timeout"
        left = datetime.timedelta(seconds=max(deadline - time.monotonic(), 1e-3))
        try:
            done = work.wait(timeout=left)
        except RuntimeError as e:
            done, cause = False, e
        else:
            cause = None
        if done is False:
            to = [d for s, d in pairs if s == me]
            frm = [s for s, d in pairs if d == me]
            raise RuntimeError(
                f"parameter reallocation on worker {me} did not complete (timeout {timeout_s} s; "
                f"sending to workers {to}, receiving from {frm}): is a peer gone? {cause or ''}"
            ) from cause


def reallocate(
    plan: ReallocPlan,
    me: int,
    src_module: nn.Module | None,
    dst_module: nn.Module | None,
    timeout_s: float,
    first_tag: int = 0,
    *,
    group: dist.ProcessGroup,
) -> ReallocStats:
    """Move a model's weights from ``src_module`` (this worker's part of the source layout) into
    ``dst_module`` (its part of the destination layout) as ``plan`` says.

    Every worker of either placement calls it with the same plan (``src_module`` None outside the
    source placement, ``dst_module`` None outside the destination) and the same ``group``: a
    group of exactly those workers (the other workers are not waited for, and need not know of
    the move). Messages use tags ``first_tag`` .. ``first_tag + plan.n_tags - 1`` of that group.
    """
    workers = sorted({*plan.src_workers, *plan.dst_workers})
    members = sorted(dist.get_process_group_ranks(group))
    if members != workers:
        raise ValueError(
            f"a reallocation between workers {workers} must use a group of exactly them, got one of {members}"
        )
    if src_module is not None:
        reshard_fsdp(src_module)
    src = local_tensors(src_module, plan.src_boxes, me, "source") if me in plan.src_workers else None
    dst = local_tensors(dst_module, plan.dst_boxes, me, "destination") if me in plan.dst_workers else None
    return move(plan, me, src, dst, timeout_s, first_tag, group)
