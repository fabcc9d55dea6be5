"""Generation through pipeline stages, ReaL's way.

Each micro-batch of prompts keeps its own KV cache on every stage, for that stage's blocks only.
A decoding step of a micro-batch goes down the stages: the first embeds its tokens, each stage
runs its blocks and sends the hidden states on, and the last stage samples the next tokens.
It sends those tokens to every other stage: the first embeds them at the micro-batch's next step,
and every stage drops the rows that just ended (EOS, or the token limit) from its cache.

Micro-batches take turns: while the last stage samples micro-batch i, the first already runs
micro-batch i + 1, so with at least as many micro-batches as stages no stage waits for a token.
Every stage walks the micro-batches in the same order and knows how many rows each still has (it
sees the same tokens), so each receive is posted with the exact shape that arrives. Sends are
asynchronous: a stage never waits for a peer to take what it sent before going on.

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
from realrl.impl.model.nn.generation import _assemble
from realrl.impl.model.nn.sampling import answer_keys, eos_tensor, next_tokens
from realrl.impl.model.parallel.pipeline import PipelineStage, StageLinks


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
    sends: list = []  # asynchronous sends in flight (their buffers kept alive until done)
    weights = DecodeWeights()  # decode-time projection weights, prepared once for every micro-batch
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

    def send(tensor: torch.Tensor, stage_index: int) -> None:
        peer = links.peer(stage_index)
        tensor = tensor.contiguous()
        sends.append((links.p2p.isend(tensor, peer, group=links.group), tensor))

    def receive(shape: tuple, dtype: torch.dtype, stage_index: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=device)
        links.p2p.recv(buf, links.peer(stage_index), group=links.group)
        return buf

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

    def prefill(d: _Decoding) -> None:
        p = d.prompts
        meta = PackedMeta.from_cu_seqlens(p.cu_seqlens, p.input_ids.shape[0])
        ctx = PackedContext(meta, impl)
        rows = torch.repeat_interleave(torch.arange(d.lens.numel(), device=device), d.lens)
        ctx.cache, ctx.cache_slots = d.cache, d.cache.slots(rows, meta.positions)
        x = (
            p.input_ids
            if spec.first
            else receive((p.input_ids.shape[0], cfg.hidden_dim), wire, spec.stage - 1)
        )
        x = stage.blocks(x, ctx)
        d.cache.repeat_interleave(g.n)
        d.lens = d.lens.repeat_interleave(g.n)
        if not spec.last:
            send(x.to(wire), spec.stage + 1)
            return
        logits = stage.outputs(x[p.cu_seqlens[1:].long() - 1]).repeat_interleave(g.n, dim=0)
        sample(d, logits)

    def decode(d: _Decoding) -> None:
        rows = d.live.numel()
        ctx = DecodeContext(d.cache, d.lens, int(d.lens.max()) + 1, weights, impl)
        x = d.tokens if spec.first else receive((rows, cfg.hidden_dim), wire, spec.stage - 1)
        x = stage.blocks(x, ctx)
        d.lens = d.lens + 1  # the new token's slot is filled
        if not spec.last:
            send(x.to(wire), spec.stage + 1)
            return
        sample(d, stage.outputs(x))

    def sample(d: _Decoding, logits: torch.Tensor) -> None:
        tokens, logp = next_tokens(logits, g, eos, d.step, d.keys)
        d.out_tokens[d.live, d.step] = tokens
        d.out_logp[d.live, d.step] = logp
        for other in range(spec.n_stages - 1):
            send(tokens, other)
        drop_ended(d, tokens)

    for d in decodings:
        prefill(d)
    while not all(d.finished for d in decodings):
        for d in decodings:
            if d.finished:
                continue
            if not spec.last:  # the tokens the last stage sampled at this micro-batch's last step
                drop_ended(d, receive((d.live.numel(),), torch.long, spec.n_stages - 1))
                if d.finished:
                    continue
            decode(d)
    for work, _ in sends:
        work.wait()
    if not spec.last:
        return []
    return [
        _assemble(d.prompts.input_ids, d.prompt_lens, g.n, d.out_tokens, d.out_logp, d.gen_lens, eos)
        for d in decodings
    ]
