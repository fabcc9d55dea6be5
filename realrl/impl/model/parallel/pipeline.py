"""Pipeline parallelism: a ReaLModel cut into stages, and the schedules that run packed
micro-batches through them.

A stage holds a contiguous run of blocks (``model_size.stage_layers``: the split whose fullest
stage holds the fewest parameters), the embedding on the first stage, the final norm and the head
on the last. Activations travel between neighbouring stages over the pipeline group as one
``[tokens, hidden]`` tensor per micro-batch. Nothing is padded: every stage holds the same
micro-batches (the data reaches every rank of a data-parallel replica), so each knows every
micro-batch's token count and attention layout from the batch itself, and a receive is posted with
the exact shape that will arrive.

Training runs the 1F1B schedule ("PipeDream-Flush", as Megatron-LM's non-interleaved schedule):
stage ``s`` of ``p`` runs ``min(p - s - 1, m)`` forwards to fill the pipeline, then alternates one
forward and one backward, then drains the remaining backwards. At most ``p - s`` micro-batches'
activations are alive on stage ``s`` at once (GPipe keeps all ``m``), for the same bubble,
``(p - 1) / (m + p - 1)`` of the step. Each exchange that goes both ways (a forward's output
down, a backward's gradient up) is posted as one batch of sends and receives, so two neighbours
never wait on each other's send. Inference runs the forwards alone.

``torch.distributed.pipelining`` was not used: its stages need fixed activation shapes declared
up front, and a packed micro-batch's token count changes with every micro-batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_size import stage_layers
from realrl.impl.model.modules.attention import PackedMeta, activation_dtype, resolve_attn_impl
from realrl.impl.model.modules.kv_cache import PackedContext
from realrl.impl.model.nn.compiled_blocks import CompiledBlocks, block_runner
from realrl.impl.model.nn.moe_stats import RouterLog, attach_router_stats
from realrl.impl.model.nn.real_model import reset_critic_head

INPUT_KEY = "packed_input_ids"
LossFn = Callable[[torch.Tensor, SequenceSample], tuple[torch.Tensor, dict]]


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """Stage ``stage`` of ``n_stages``, holding blocks ``layers``."""

    stage: int
    n_stages: int
    layers: range

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.n_stages - 1

    @classmethod
    def of(cls, config: Any, stage: int, n_stages: int) -> StageSpec:
        return cls(stage, n_stages, stage_layers(config, n_stages)[stage])


def param_stages(config: Any, names: list[str], n_stages: int) -> dict[str, tuple[int, ...]]:
    """Which of ``n_stages`` stages hold each parameter of a whole model (by its name there): a
    block's, the stage of its layers; the embedding's, the first (and, tied to the head, the last
    too); the final norm's and the head's, the last."""
    last = n_stages - 1
    block_stage = {i: s for s, layers in enumerate(stage_layers(config, n_stages)) for i in layers}
    tied = bool(config.tied_embedding) and not config.is_critic
    out = {}
    for name in names:
        parts = name.split(".")
        if parts[0] == "layers":
            out[name] = (block_stage[int(parts[1])],)
        elif parts[0] == "embed":
            out[name] = (0, last) if tied and name == "embed.wte.weight" else (0,)
        else:
            out[name] = (last,)
    return out


class PipelineStage(nn.Module):
    """The parts of a ReaLModel one stage runs: ``forward(ids or activations, cu_seqlens)`` gives
    the next stage's input, or, on the last stage, the logits (a critic's values)."""

    def __init__(self, model: nn.Module, spec: StageSpec):
        super().__init__()
        cfg = model.config
        self.config, self.spec = cfg, spec
        self.embed = model.embed if spec.first else None
        # keyed by the block's index in the whole model: parameter names are the whole model's
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in spec.layers})
        self.final_ln = model.final_ln if spec.last else None
        self.head = model.head if spec.last else None
        self.rotary = model.rotary
        self.requested_attn_impl = model.requested_attn_impl
        self.lora = None
        self.base_path = getattr(model, "base_path", None)
        self.critic_head_seed = getattr(model, "critic_head_seed", 0)
        self.critic_head_init = getattr(model, "critic_head_init", "reward")
        self.compiled_blocks: CompiledBlocks | None = None  # set by ``compiled_blocks.compile_blocks``

    @classmethod
    def of(cls, model: nn.Module, stage: int, n_stages: int) -> PipelineStage:
        """Stage ``stage`` of ``n_stages`` of ``model``, cut by the balanced split."""
        return cls(model, StageSpec.of(model.config, stage, n_stages))

    def reset_critic_head(self) -> None:
        """The last stage's critic head, as the whole model would draw it."""
        if self.head is not None:
            reset_critic_head(self.head, self.critic_head_init, self.critic_head_seed)

    @property
    def blocks_in_order(self) -> list[nn.Module]:
        return list(self.layers.values())

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks_in_order[0].attn.q.weight.dtype

    @property
    def tied(self) -> bool:
        """Whether the head reuses the token embedding, held by the first stage and the last."""
        return bool(self.config.tied_embedding) and not self.config.is_critic and self.spec.n_stages > 1

    def tied_weight(self) -> nn.Parameter | None:
        """This stage's copy of a tied embedding (the first stage's embedding, the last's head)."""
        if not self.tied:
            return None
        return self.embed.wte.weight if self.spec.first else self.head.weight if self.spec.last else None

    @torch.no_grad()
    def materialize(self, device: torch.device | str) -> None:
        """Allocate a stage cut from a model on "meta" on ``device`` (values undefined) and recompute
        the rotary frequencies, as ``ReaLModel.materialize`` does for a whole model."""
        from realrl.impl.model.modules.rotary import rotary_inv_freq

        cfg = self.config
        self.to_empty(device=device)
        if cfg.tied_embedding and not cfg.is_critic and self.spec.n_stages == 1:
            self.head.weight = self.embed.wte.weight
        if self.rotary is not None:
            self.rotary.inv_freq.copy_(rotary_inv_freq(cfg.head_dim, cfg.rotary_base, cfg.rotary_scaling))

    def dry_run(self) -> None:
        """One token through this stage alone (FSDP2 settles its root at the first forward)."""
        device = next(self.parameters()).device
        ids = torch.zeros(1, dtype=torch.long, device=device)
        cu = torch.tensor([0, 1], dtype=torch.int32, device=device)
        hidden = None
        if not self.spec.first:
            hidden = torch.zeros(1, self.config.hidden_dim, dtype=self.dtype, device=device)
        with torch.no_grad():
            self(ids, cu, hidden)

    def save_pretrained(self, save_dir: str, tokenizer: Any = None, state_dict: dict | None = None) -> None:
        """An ordinary HF folder from ``state_dict``: the whole model's weights, gathered from
        every stage (``PipelineRun.gather_stages``)."""
        from realrl.impl.model.nn.hf_io import save_pretrained

        if state_dict is None:
            raise ValueError("a pipeline stage holds part of the model: save it from its gathered state dict")
        save_pretrained(self, save_dir, tokenizer, state_dict)

    def context(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> PackedContext:
        meta = PackedMeta.from_cu_seqlens(cu_seqlens, input_ids.shape[0])
        dtype = activation_dtype(self.dtype, input_ids.device)
        impl = resolve_attn_impl(self.requested_attn_impl, input_ids.device.type, dtype)
        ctx = PackedContext(meta, impl, self.config.attn_pdrop if self.training else 0.0)
        ctx.router_log = RouterLog(self.config.n_experts) if self.routes() else None
        return ctx

    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        hidden: torch.Tensor | None = None,
        output_index: torch.Tensor | None = None,
        routed: torch.Tensor | None = None,
        with_routing: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        """``input_ids`` and ``cu_seqlens`` describe the micro-batch (every stage has them);
        ``hidden``: the previous stage's output (None on the first stage). A Mixture-of-Experts
        model's training forward also carries the sparse blocks' routing records: ``routed``, the
        earlier stages' (``RouterLog.pack``); ``with_routing``: return ``(output, records so far)``
        (None without routing), which the next stage receives. The last stage's output carries the
        routing statistics of every block, as a whole model's does."""
        ctx = self.context(input_ids, cu_seqlens)
        log = ctx.router_log
        if log is not None and routed is not None:
            log.extend(routed)
        x = self.blocks(input_ids if self.spec.first else hidden, ctx)
        if self.spec.last:
            if output_index is not None:
                x = x[output_index.to(device=x.device, dtype=torch.long)]
            x = self.outputs(x)
            if log is not None:
                attach_router_stats(x, log.stats(self.config.router_aux_loss_coef))
        if not with_routing:
            return x
        return x, (log.pack() if log is not None and log.counts and not self.spec.last else None)

    def routes(self) -> bool:
        """Whether this forward records routing: a Mixture-of-Experts model, gradients on."""
        return bool(self.config.n_experts and self.config.moe_layers) and torch.is_grad_enabled()

    def sparse_blocks_through(self, stage: int) -> int:
        """How many sparse blocks stages 0..``stage`` hold: the rows of their routing records."""
        layers = stage_layers(self.config, self.spec.n_stages)
        return sum(self.config.is_moe_layer(i) for r in layers[: stage + 1] for i in r)

    def blocks(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The embedding (first stage: ``x`` holds token ids) and this stage's blocks, under an
        attention context (a packed forward, a prefill or a decoding step)."""
        if self.spec.first:
            x = self.embed(x, ctx.positions)
        rope = None
        if self.rotary is not None:
            rope = self.rotary(ctx.positions, ctx.max_position, activation_dtype(x.dtype, x.device))
        run = block_runner(self.compiled_blocks, ctx)
        for layer in self.layers.values():
            x = run(layer, x, rope, ctx, None)
        return x

    def outputs(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's final norm and head: logits (a critic's values)."""
        out = self.head(self.final_ln(x))
        return out.squeeze(-1) if self.config.is_critic else out


Message = tuple[tuple[int, ...], torch.dtype]  # what a receive expects: shape and dtype


class PointToPoint(Protocol):
    """The point-to-point call the schedules post their messages with: ``torch.distributed``'s
    own by default, or a stand-in with the same signature (a test's, holding gloo to NCCL's
    rules)."""

    def batch_isend_irecv(self, p2p_op_list: list[dist.P2POp]) -> list[Any]: ...


@dataclasses.dataclass
class StageLinks:
    """Point-to-point exchanges with the neighbouring stages over the pipeline group."""

    group: dist.ProcessGroup
    spec: StageSpec
    hidden_dim: int
    dtype: torch.dtype = torch.float32
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    # the global rank of every stage, in stage order (None: the group's own rank order, which
    # torch sorts: a layout may place its stages on workers in any order)
    stage_ranks: tuple[int, ...] | None = None
    p2p: PointToPoint = dist  # the calls that move the messages

    def peer(self, stage: int) -> int:
        """The global rank of stage ``stage``."""
        if self.stage_ranks is not None:
            return self.stage_ranks[stage]
        return dist.get_global_rank(self.group, stage)

    def _peer(self, offset: int) -> int:
        return self.peer(self.spec.stage + offset)

    def activations(self, n_tokens: int) -> Message:
        """The message of ``n_tokens`` tokens' activations (or their gradient)."""
        return (n_tokens, self.hidden_dim), self.dtype

    def exchange(
        self, sends: list[tuple[torch.Tensor, int]], receives: list[tuple[Message | int, int]]
    ) -> list[torch.Tensor]:
        """Post every send (tensor, stage offset) and receive (message, stage offset; a number of
        tokens: their activations) at once, wait for all, return the received tensors in order."""
        ops, out = [], []
        for tensor, offset in sends:
            ops.append(dist.P2POp(dist.isend, tensor.detach().contiguous(), self._peer(offset), self.group))
        for message, offset in receives:
            shape, dtype = self.activations(message) if isinstance(message, int) else message
            buf = torch.empty(shape, dtype=dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, buf, self._peer(offset), self.group))
            out.append(buf)
        if ops:
            for work in self.p2p.batch_isend_irecv(ops):
                work.wait()
        return out


def _tokens(mb: SequenceSample) -> int:
    return int(mb.data[INPUT_KEY].shape[0])


def _forward(
    stage: PipelineStage,
    mb: SequenceSample,
    hidden: torch.Tensor | None,
    output_index_fn,
    routed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids = mb.data[INPUT_KEY]
    cu = mb.cu_seqlens(INPUT_KEY).to(ids.device)
    index = output_index_fn(mb) if (output_index_fn is not None and stage.spec.last) else None
    return stage(ids, cu, hidden, index, routed, with_routing=True)


def forward_only(
    stage: PipelineStage, links: StageLinks, mbs: list[SequenceSample], output_index_fn=None
) -> list[torch.Tensor]:
    """Inference: every micro-batch through every stage; the last stage returns the outputs (the
    others an empty list). A stage sends micro-batch i on and starts i + 1 while the next stage
    works on i."""
    spec, outs = stage.spec, []
    with torch.no_grad():
        for mb in mbs:
            hidden = None if spec.first else links.exchange([], [(_tokens(mb), -1)])[0]
            out, _ = _forward(stage, mb, hidden, output_index_fn)
            if spec.last:
                outs.append(out)
            else:
                links.exchange([(out.to(links.dtype), +1)], [])
    return outs


@dataclasses.dataclass
class _Live:
    """A micro-batch between its forward and its backward on this stage."""

    index: int
    inputs: list[torch.Tensor]  # what it received (activations, routing records), leaves
    outputs: list[torch.Tensor]  # what it sent on (activations, routing records), or the scaled loss


def train_1f1b(
    stage: PipelineStage,
    links: StageLinks,
    mbs: list[SequenceSample],
    loss_fn: LossFn,
    scales: list[float],
    output_index_fn=None,
) -> list[tuple[float, dict] | None]:
    """Forward and backward of every micro-batch in the 1F1B order, gradients accumulated into the
    stage's parameters. ``scales[i]``: what micro-batch i's loss is multiplied by before its
    backward (its share of the batch's loss weight). The last stage returns each micro-batch's
    (loss, stats), None where its scale is 0 (the loss is not computed); the others an empty list.
    The order of a stage's steps is recorded in ``stage.schedule_log`` (``("F", i)`` /
    ``("B", i)``) when that attribute is a list.

    A Mixture-of-Experts model's routing records travel with the activations (and their
    gradients back), so the last stage's loss holds the load-balancing term over every block."""
    spec, m = stage.spec, len(mbs)
    warmup = min(spec.n_stages - spec.stage - 1, m)
    log = getattr(stage, "schedule_log", None)
    live: list[_Live] = []
    results: list[tuple[float, dict] | None] = []
    routes = stage.routes()
    records_in = stage.sparse_blocks_through(spec.stage - 1) if routes and not spec.first else 0
    records_out = stage.sparse_blocks_through(spec.stage) if routes and not spec.last else 0
    width = 2 * stage.config.n_experts + 1

    def received(n_tokens: int, rows: int) -> list:
        """What comes in from a neighbour: ``n_tokens``' activations, then ``rows`` routing records."""
        return [n_tokens] + ([((rows, width), torch.float32)] if rows else [])

    def forward(i: int, inputs: list[torch.Tensor]) -> _Live:
        for t in inputs:
            t.requires_grad_(True)
        hidden = inputs[0] if inputs else None
        routed = inputs[1] if len(inputs) > 1 else None
        out, records = _forward(stage, mbs[i], hidden, output_index_fn, routed)
        if spec.last and scales[i] == 0:  # nothing to learn (no loss tokens, or a lockstep repeat)
            results.append(None)
            outputs = [out.float().sum() * 0.0]  # its mean loss may be 0/0; the backward must still run
        elif spec.last:
            loss, stats = loss_fn(out, mbs[i])
            results.append((float(loss.detach()), stats))
            outputs = [loss.float() * scales[i]]
        else:
            outputs = [out] + ([records] if records_out else [])
        if log is not None:
            log.append(("F", i))
        return _Live(i, inputs, outputs)

    def backward(item: _Live, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        if spec.last:
            item.outputs[0].backward()
        else:
            torch.autograd.backward(item.outputs, [g.to(o.dtype) for o, g in zip(item.outputs, grads)])
        if log is not None:
            log.append(("B", item.index))
        # what goes back: each input's gradient (zeros where nothing reached it: an unused record)
        return [t.grad if t.grad is not None else torch.zeros_like(t) for t in item.inputs]

    def sends_of(outputs: list[torch.Tensor]) -> list[tuple[torch.Tensor, int]]:
        return [(outputs[0].to(links.dtype), +1)] + [(t, +1) for t in outputs[1:]]

    def receive_input(i: int) -> list[torch.Tensor]:
        return (
            [] if spec.first else links.exchange([], [(x, -1) for x in received(_tokens(mbs[i]), records_in)])
        )

    # fill: forwards only
    for i in range(warmup):
        item = forward(i, receive_input(i))
        live.append(item)
        links.exchange(sends_of(item.outputs), [])
    # steady state: one forward, one backward
    inputs = receive_input(warmup) if warmup < m else []
    for i in range(warmup, m):
        item = forward(i, inputs)
        live.append(item)
        oldest = live.pop(0)
        if spec.last:
            grads = []
        else:  # send this forward's outputs down, receive the oldest one's gradients back
            wanted = received(_tokens(mbs[oldest.index]), records_out)
            grads = links.exchange(sends_of(item.outputs), [(x, +1) for x in wanted])
        input_grads = backward(oldest, grads)
        more = i + 1 < m
        sends = [] if spec.first else [(g, -1) for g in input_grads]
        receives = (
            [(x, -1) for x in received(_tokens(mbs[i + 1]), records_in)] if more and not spec.first else []
        )
        inputs = links.exchange(sends, receives)
    # drain: the remaining backwards
    while live:
        oldest = live.pop(0)
        grads = links.exchange([], [(x, +1) for x in received(_tokens(mbs[oldest.index]), records_out)])
        input_grads = backward(oldest, grads)
        if not spec.first:
            links.exchange([(g, -1) for g in input_grads], [])
    return results


def pipeline_grad_norm(params: list[torch.Tensor], group: dist.ProcessGroup) -> float:
    """The whole model's gradient norm: each stage's squares summed over the pipeline group (for
    clipping, which must scale every stage by the same factor)."""
    local = sum(float(p.grad.detach().float().pow(2).sum()) for p in params if p.grad is not None)
    t = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return float(t.sqrt())
