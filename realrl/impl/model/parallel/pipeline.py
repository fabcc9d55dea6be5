"""Pipeline parallelism: a ReaLModel cut into stages, and the schedules that run packed
micro-batches through them.

A stage holds a contiguous run of blocks (``param_count.stage_layers``: the split whose fullest
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
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from realrl.api.core.data_api import SequenceSample
from realrl.api.quickstart.param_count import stage_layers
from realrl.impl.model.modules.attention import PackedMeta, activation_dtype, resolve_attn_impl
from realrl.impl.model.modules.kv_cache import PackedContext
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
        if cfg.n_experts:
            raise NotImplementedError("pipeline stages of a Mixture-of-Experts model are not built yet")
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
        every stage (``pipeline_state.gather_stages``)."""
        from realrl.impl.model.nn.hf_io import save_pretrained

        if state_dict is None:
            raise ValueError("a pipeline stage holds part of the model: save it from its gathered state dict")
        save_pretrained(self, save_dir, tokenizer, state_dict)

    def context(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> PackedContext:
        meta = PackedMeta.from_cu_seqlens(cu_seqlens, input_ids.shape[0])
        dtype = activation_dtype(self.dtype, input_ids.device)
        impl = resolve_attn_impl(self.requested_attn_impl, input_ids.device.type, dtype)
        return PackedContext(meta, impl, self.config.attn_pdrop if self.training else 0.0)

    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        hidden: torch.Tensor | None = None,
        output_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``input_ids`` and ``cu_seqlens`` describe the micro-batch (every stage has them);
        ``hidden``: the previous stage's output (None on the first stage)."""
        ctx = self.context(input_ids, cu_seqlens)
        x = self.blocks(input_ids if self.spec.first else hidden, ctx)
        if not self.spec.last:
            return x
        if output_index is not None:
            x = x[output_index.to(device=x.device, dtype=torch.long)]
        return self.outputs(x)

    def blocks(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The embedding (first stage: ``x`` holds token ids) and this stage's blocks, under an
        attention context (a packed forward, a prefill or a decoding step)."""
        if self.spec.first:
            x = self.embed(x, ctx.positions)
        rope = None
        if self.rotary is not None:
            rope = self.rotary(ctx.positions, ctx.max_position, activation_dtype(x.dtype, x.device))
        for layer in self.layers.values():
            x = layer(x, rope, ctx, None)
        return x

    def outputs(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's final norm and head: logits (a critic's values)."""
        out = self.head(self.final_ln(x))
        return out.squeeze(-1) if self.config.is_critic else out


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

    def peer(self, stage: int) -> int:
        """The global rank of stage ``stage``."""
        if self.stage_ranks is not None:
            return self.stage_ranks[stage]
        return dist.get_global_rank(self.group, stage)

    def _peer(self, offset: int) -> int:
        return self.peer(self.spec.stage + offset)

    def _buffer(self, n_tokens: int) -> torch.Tensor:
        return torch.empty(n_tokens, self.hidden_dim, dtype=self.dtype, device=self.device)

    def exchange(
        self, sends: list[tuple[torch.Tensor, int]], receives: list[tuple[int, int]]
    ) -> list[torch.Tensor]:
        """Post every send (tensor, stage offset) and receive (tokens, stage offset) at once, wait
        for all, return the received tensors in order."""
        ops, out = [], []
        for tensor, offset in sends:
            wire = tensor.detach().to(self.dtype).contiguous()
            ops.append(dist.P2POp(dist.isend, wire, self._peer(offset), self.group))
        for n_tokens, offset in receives:
            buf = self._buffer(n_tokens)
            ops.append(dist.P2POp(dist.irecv, buf, self._peer(offset), self.group))
            out.append(buf)
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return out


def _tokens(mb: SequenceSample) -> int:
    return int(mb.data[INPUT_KEY].shape[0])


def _forward(
    stage: PipelineStage, mb: SequenceSample, hidden: torch.Tensor | None, output_index_fn
) -> torch.Tensor:
    ids = mb.data[INPUT_KEY]
    cu = mb.cu_seqlens(INPUT_KEY).to(ids.device)
    index = output_index_fn(mb) if (output_index_fn is not None and stage.spec.last) else None
    return stage(ids, cu, hidden, index)


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
            out = _forward(stage, mb, hidden, output_index_fn)
            if spec.last:
                outs.append(out)
            else:
                links.exchange([(out, +1)], [])
    return outs


@dataclasses.dataclass
class _Live:
    """A micro-batch between its forward and its backward on this stage."""

    index: int
    inputs: torch.Tensor | None  # the received activations (None on the first stage)
    outputs: torch.Tensor  # this stage's output, or the scaled loss on the last stage


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
    (loss, stats), None where its scale is 0 (the loss is not computed); the others an empty list. The order of a stage's steps is recorded in
    ``stage.schedule_log`` (``("F", i)`` / ``("B", i)``) when that attribute is a list."""
    spec, m = stage.spec, len(mbs)
    warmup = min(spec.n_stages - spec.stage - 1, m)
    log = getattr(stage, "schedule_log", None)
    live: list[_Live] = []
    results: list[tuple[float, dict]] = []

    def forward(i: int, hidden: torch.Tensor | None) -> _Live:
        if hidden is not None:
            hidden.requires_grad_(True)
        out = _forward(stage, mbs[i], hidden, output_index_fn)
        if spec.last and scales[i] == 0:  # nothing to learn (no loss tokens, or a lockstep repeat)
            results.append(None)
            out = out.float().sum() * 0.0  # its mean loss may be 0/0; the backward must still run
        elif spec.last:
            loss, stats = loss_fn(out, mbs[i])
            results.append((float(loss.detach()), stats))
            out = loss.float() * scales[i]
        if log is not None:
            log.append(("F", i))
        return _Live(i, hidden, out)

    def backward(item: _Live, grad: torch.Tensor | None) -> torch.Tensor | None:
        if spec.last:
            item.outputs.backward()
        else:
            torch.autograd.backward(item.outputs, grad.to(item.outputs.dtype))
        if log is not None:
            log.append(("B", item.index))
        return None if item.inputs is None else item.inputs.grad

    def receive_input(i: int) -> torch.Tensor | None:
        return None if spec.first else links.exchange([], [(_tokens(mbs[i]), -1)])[0]

    # fill: forwards only
    for i in range(warmup):
        item = forward(i, receive_input(i))
        live.append(item)
        links.exchange([(item.outputs, +1)], [])
    # steady state: one forward, one backward
    hidden = receive_input(warmup) if warmup < m else None
    for i in range(warmup, m):
        item = forward(i, hidden)
        live.append(item)
        oldest = live.pop(0)
        if spec.last:
            grad = None
        else:  # send this forward's output down, receive the oldest one's gradient back
            (grad,) = links.exchange([(item.outputs, +1)], [(_tokens(mbs[oldest.index]), +1)])
        input_grad = backward(oldest, grad)
        more = i + 1 < m
        sends = [] if spec.first else [(input_grad, -1)]
        receives = [(_tokens(mbs[i + 1]), -1)] if more and not spec.first else []
        got = links.exchange(sends, receives)
        hidden = got[0] if receives else None
    # drain: the remaining backwards
    while live:
        oldest = live.pop(0)
        (grad,) = links.exchange([], [(_tokens(mbs[oldest.index]), +1)])
        input_grad = backward(oldest, grad)
        if not spec.first:
            links.exchange([(input_grad, -1)], [])
    return results


def pipeline_grad_norm(params: list[torch.Tensor], group: dist.ProcessGroup) -> float:
    """The whole model's gradient norm: each stage's squares summed over the pipeline group (for
    clipping, which must scale every stage by the same factor)."""
    local = sum(float(p.grad.detach().float().pow(2).sum()) for p in params if p.grad is not None)
    t = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return float(t.sqrt())
