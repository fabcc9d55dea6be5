"""Generation through pipeline stages, ReaL's way.

Each micro-batch of prompts keeps its own KV cache on every stage, for that stage's blocks only.
A decoding step of a micro-batch goes down the stages: the first embeds its tokens, each stage
runs its blocks and sends the hidden states on, and the last stage samples the next tokens.
It sends those tokens to every other stage: the first embeds them at the micro-batch's next step,
and every stage drops the rows that just ended (EOS, or the token limit) from its cache.

Micro-batches take turns on a clock every stage keeps alike. With ``m`` micro-batches over ``p``
stages and a period of ``max(m, p)`` ticks, stage ``s`` runs step ``k`` of micro-batch ``i`` at
tick ``k * period + i + s``: while the last stage samples micro-batch i, the first already runs
micro-batch i + 1, and a micro-batch's tokens reach every stage by the tick its next step starts
there. Every stage knows every micro-batch's step and rows (it sees the same tokens), so it knows
what each stage does at each tick, and each receive is posted with the exact shape that arrives.

Each tick a stage posts one batch of messages: what it computed at the previous tick (activations
to the next stage; on the last, the tokens to every other stage) and the receives of this tick
(its input activations, the tokens the last stage sampled at the previous tick). Every message is
sent and received in the same tick's batches on both sides, so no send waits on a receive its
peer posts later: the schedule does not rely on the transport buffering sends (NCCL runs a pair's
operations in order and holds a send until its receive is posted).

Sampling is the single-process generator's (``nn/generation.py``): the same per-answer keys and
``next_tokens``. Each answer's tokens therefore depend on its key only, not on the stages or on
the micro-batches.
"""

from __future__ import annotations

import dataclasses

import torch

from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput
from realrl.impl.model.kernels import DecodeWeights
from realrl.impl.model.modules.attention import PackedMeta, activation_dtype, resolve_attn_impl
from realrl.impl.model.modules.kv_cache import DecodeContext, KVCache, PackedContext
from realrl.impl.model.nn.generation import _assemble, block_sampling_group
from realrl.impl.model.nn.sampling import answer_keys, eos_tensor, next_tokens
from realrl.impl.model.parallel.pipeline import Message, PipelineStage, StageLinks


@dataclasses.dataclass
class Prompts:
    """One micro-batch of packed prompts and their sampling keys (int64, one per prompt)."""

    input_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    prompt_keys: torch.Tensor


@dataclasses.dataclass
class _Decoding:
    """One micro-batch's decoding on this stage."""

    prompts: Prompts
    cache: KVCache
    lens: torch.Tensor  # filled cache slots per live row
    live: torch.Tensor  # live row -> answer index
    step: int = 0
    finished: bool = False
    # the last stage's: sampling keys of the live rows, and what was sampled
    keys: torch.Tensor | None = None
    out_tokens: torch.Tensor | None = None
    out_logp: torch.Tensor | None = None
    gen_lens: torch.Tensor | None = None
    tokens: torch.Tensor | None = None  # the first stage's next input

    @property
    def prompt_lens(self) -> list[int]:
        return (self.prompts.cu_seqlens[1:] - self.prompts.cu_seqlens[:-1]).tolist()


@torch.no_grad()
def generate_pipelined(
    stage: PipelineStage,
    links: StageLinks,
    micro_batches: list[Prompts],
    g: GenerationHyperparameters,
    eos_token_id: int | list[int] | None,
) -> list[GenerationOutput]:
    """Every micro-batch's answers (``g.n`` per prompt): the last stage returns one
    ``GenerationOutput`` per micro-batch, the other stages an empty list."""
    spec, cfg = stage.spec, stage.config
    device = micro_batches[0].input_ids.device if micro_batches else torch.device("cpu")
    eos = eos_tensor(eos_token_id, device)
    dtype = activation_dtype(stage.dtype, device)  # what attention computes in (the KV cache's)
    wire = stage.dtype  # what the residual stream between stages is in (autocast keeps it fp32)
    impl = resolve_attn_impl(stage.requested_attn_impl, device.type, dtype)
    n_kv = stage.blocks_in_order[0].attn.n_kv
    weights = DecodeWeights()  # decode-time projection weights, prepared once for every micro-batch
    tp_group = block_sampling_group(stage.blocks_in_order[0])  # the last stage's ranks sample alike
    decodings = []
    for p in micro_batches:
        lens = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).long()
        capacity = int(lens.max()) + g.max_new_tokens
        cache = KVCache(
            len(spec.layers), lens.numel(), n_kv, capacity, cfg.head_dim, dtype, device, spec.layers[0]
        )
        d = _Decoding(p, cache, lens, torch.arange(lens.numel() * g.n, device=device))
        if spec.last:
            n_answers = lens.numel() * g.n
            d.keys = answer_keys(p.prompt_keys.to(device), g.n)
            d.out_tokens = torch.zeros(n_answers, g.max_new_tokens, dtype=torch.long, device=device)
            d.out_logp = torch.zeros(n_answers, g.max_new_tokens, dtype=torch.float32, device=device)
            d.gen_lens = torch.full((n_answers,), g.max_new_tokens, dtype=torch.long, device=device)
        decodings.append(d)

    def drop_ended(d: _Decoding, tokens: torch.Tensor) -> None:
        """After step ``d.step`` sampled ``tokens``: rows that ended leave (every stage alike)."""
        if d.step == g.max_new_tokens - 1:
            d.finished = True
            return
        ended = (
            torch.isin(tokens, eos)
            if (eos.numel() and not g.fixed_length)
            else torch.zeros_like(tokens, dtype=torch.bool)
        )
        keep = (~ended).nonzero().squeeze(-1)
        if spec.last and bool(ended.any()):
            d.gen_lens[d.live[ended]] = d.step + 1
        d.live, d.lens = d.live[keep], d.lens[keep]
        d.cache.select(keep)
        if spec.last:
            d.keys = d.keys[keep]
        if spec.first:
            d.tokens = tokens[keep]
        d.finished = keep.numel() == 0
        d.step += 1

    def prefill(d: _Decoding, x: torch.Tensor | None) -> list[tuple[torch.Tensor, int]]:
        """Step 0 (the prompts) of ``d`` on this stage, from the previous stage's activations
        ``x`` (None on the first); what to send at the next tick."""
        p = d.prompts
        meta = PackedMeta.from_cu_seqlens(p.cu_seqlens, p.input_ids.shape[0])
        ctx = PackedContext(meta, impl)
        rows = torch.repeat_interleave(torch.arange(d.lens.numel(), device=device), d.lens)
        ctx.cache, ctx.cache_slots = d.cache, d.cache.slots(rows, meta.positions)
        x = stage.blocks(p.input_ids if spec.first else x, ctx)
        d.cache.repeat_interleave(g.n)
        d.lens = d.lens.repeat_interleave(g.n)
        if not spec.last:
            return [(x.to(wire), +1)]
        logits = stage.outputs(x[p.cu_seqlens[1:].long() - 1]).repeat_interleave(g.n, dim=0)
        return sample(d, logits)

    def decode(d: _Decoding, x: torch.Tensor | None) -> list[tuple[torch.Tensor, int]]:
        """Step ``d.step`` of ``d`` on this stage (``x`` as in ``prefill``)."""
        ctx = DecodeContext(d.cache, d.lens, int(d.lens.max()) + 1, weights, impl)
        x = stage.blocks(d.tokens if spec.first else x, ctx)
        d.lens = d.lens + 1  # the new token's slot is filled
        if not spec.last:
            return [(x.to(wire), +1)]
        return sample(d, stage.outputs(x))

    def sample(d: _Decoding, logits: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        tokens, logp = next_tokens(logits, g, eos, d.step, d.keys, tp_group)
        d.out_tokens[d.live, d.step] = tokens
        d.out_logp[d.live, d.step] = logp
        drop_ended(d, tokens)
        return [(tokens, other - spec.stage) for other in range(spec.n_stages - 1)]

    period = max(len(decodings), spec.n_stages)

    def due(stage_index: int, tick: int) -> _Decoding | None:
        """The micro-batch whose next step stage ``stage_index`` runs at ``tick``, if any."""
        i = (tick - stage_index) % period
        if tick < stage_index or i >= len(decodings):
            return None
        d = decodings[i]
        return d if not d.finished and tick == d.step * period + i + stage_index else None

    def activations_in(d: _Decoding) -> Message:
        rows = d.prompts.input_ids.shape[0] if d.step == 0 else d.live.numel()
        return (rows, cfg.hidden_dim), wire

    outbox: list[tuple[torch.Tensor, int]] = []  # what this stage computed at the previous tick
    tick = 0
    while outbox or not all(d.finished for d in decodings):
        # a middle or last stage's input (its micro-batch's tokens arrived at an earlier tick)
        mine = None if spec.first else due(spec.stage, tick)
        receives = [] if mine is None else [(activations_in(mine), -1)]
        sampled = None if spec.last else due(spec.n_stages - 1, tick - 1)
        if sampled is not None:  # the tokens the last stage sampled at the previous tick
            receives.append((((sampled.live.numel(),), torch.long), spec.n_stages - 1 - spec.stage))
        got = links.exchange(outbox, receives)
        if sampled is not None:
            drop_ended(sampled, got.pop())
        if spec.first:  # its micro-batch's tokens may have arrived just now
            mine = due(spec.stage, tick)
        x = got[0] if got else None
        outbox = [] if mine is None else (prefill(mine, x) if mine.step == 0 else decode(mine, x))
        tick += 1
    if not spec.last:
        return []
    return [
        _assemble(d.prompts.input_ids, d.prompt_lens, g.n, d.out_tokens, d.out_logp, d.gen_lens, eos)
        for d in decodings
    ]
