"""Generation with a KV cache over packed prompts, no padding.

Prompts are prefilled in one packed forward; then each step feeds one token per live sequence.
A sequence that emits EOS leaves the live batch (its cache row is dropped), so finished
sequences stop costing compute. Log-probs are those of the sampled tokens under
``logits / temperature`` (seed 002 policy detail 1, "Scale the logits by sampling temperature"),
before top-k/top-p filtering, so a training forward recomputes them exactly.
"""

from __future__ import annotations

import torch

from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput
from realrl.impl.model.modules.attention import activation_dtype
from realrl.impl.model.modules.kv_cache import DecodeContext, KVCache, decode_attention_kernels
from realrl.impl.model.nn.transformer_block import linear
from realrl.impl.model.utils.logits_warper import warp_logits


def _eos_tensor(eos_token_id: int | list[int] | None, device) -> torch.Tensor:
    if eos_token_id is None:
        return torch.zeros(0, dtype=torch.long, device=device)
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device)


def sample_categorical(probs: torch.Tensor) -> torch.Tensor:
    """One draw per row of ``probs`` [B, V] by inverting the CDF with a single uniform per row.

    Same distribution as ``torch.multinomial(probs, 1)`` but draws B random numbers instead of
    B * V (multinomial's exponential race), which dominated the per-step sampling cost.
    Zero-probability tokens own empty CDF intervals and are never drawn.
    """
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(probs.shape[0], 1, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _next_tokens(
    logits: torch.Tensor, g: GenerationHyperparameters, eos: torch.Tensor, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [B], its log-prob under logits / temperature [B]) for one step."""
    scaled = logits.float() if g.temperature == 1.0 else logits.float() / g.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    masked = step < g.min_new_tokens and eos.numel() > 0  # EOS is not allowed yet
    pick = scaled.index_fill(-1, eos, float("-inf")) if masked else scaled
    if g.greedy:
        tokens = pick.argmax(dim=-1)
    elif masked or g.top_k > 0 or g.top_p < 1.0:
        tokens = sample_categorical(torch.softmax(warp_logits(pick, g.top_k, g.top_p), dim=-1))
    else:  # plain sampling: the probabilities are exp(logp), no second softmax
        tokens = sample_categorical(logp.exp())
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    gconfig: GenerationHyperparameters,
    eos_token_id: int | list[int] | None = None,
) -> GenerationOutput:
    if model.config.is_critic:
        raise ValueError("generate() needs a language model; this ReaLModel is a critic (scalar head)")
    was_training = model.training
    model.eval()
    try:
        return _generate(model, input_ids, cu_seqlens, gconfig, eos_token_id)
    finally:
        model.train(was_training)


def _generate(model, input_ids, cu_seqlens, g: GenerationHyperparameters, eos_token_id) -> GenerationOutput:
    cfg, device, n = model.config, input_ids.device, g.n
    eos = _eos_tensor(eos_token_id, device)
    ctx = model.packed_context(input_ids, cu_seqlens)
    prompt_lens = ctx.meta.seqlens
    if min(prompt_lens) < 1:
        raise ValueError(f"generate() needs non-empty prompts; got prompt lengths {prompt_lens}")
    n_prompts, max_new = len(prompt_lens), g.max_new_tokens
    model.check_length(max(prompt_lens) + max_new, "prompt + max_new_tokens")
    dtype = activation_dtype(model.dtype, device)  # bf16 under autocast with fp32 weights
    cache = KVCache(
        cfg.n_layers, n_prompts, model.local_kv_heads, max(prompt_lens) + max_new, cfg.head_dim, dtype, device
    )
    lens_t = torch.tensor(prompt_lens, device=device)
    rows = torch.repeat_interleave(torch.arange(n_prompts, device=device), lens_t)
    ctx.cache, ctx.cache_slots = cache, cache.slots(rows, ctx.meta.positions)

    # prefill: the last layer past attention and the head run only on each prompt's last token
    logits = model.head(model.hidden_states(input_ids, ctx, ctx.meta.cu_seqlens[1:].long() - 1))
    cache.repeat_interleave(n)
    logits = logits.repeat_interleave(n, dim=0)
    lens = lens_t.repeat_interleave(n)
    max_len = max(prompt_lens)

    weights: dict = {}  # decode-time weights, transposed once (see transformer_block.project)
    n_seqs = n_prompts * n
    live = torch.arange(n_seqs, device=device)  # row of the cache -> output sequence index
    out_tokens = torch.zeros(n_seqs, max_new, dtype=torch.long, device=device)
    out_logp = torch.zeros(n_seqs, max_new, dtype=torch.float32, device=device)
    gen_lens = torch.full((n_seqs,), max_new, dtype=torch.long, device=device)
    with decode_attention_kernels(device):
        for step in range(max_new):
            tokens, logp = _next_tokens(logits, g, eos, step)
            out_tokens[live, step] = tokens
            out_logp[live, step] = logp
            if step == max_new - 1:
                break
            if eos.numel() and not g.fixed_length:
                done = torch.isin(tokens, eos)
                if bool(done.any()):
                    gen_lens[live[done]] = step + 1
                    keep = (~done).nonzero().squeeze(-1)  # indices: one host sync, not one per tensor
                    if keep.numel() == 0:
                        break
                    live, tokens, lens = live[keep], tokens[keep], lens[keep]
                    cache.select(keep)
                    max_len = int(lens.max())  # the longest row may have finished: attend less
            h = model.hidden_states(tokens, DecodeContext(cache, lens, max_len + 1, weights, ctx.impl))
            logits = linear(h, weights, model.head)
            lens = lens + 1
            max_len += 1
    return _assemble(input_ids, prompt_lens, n, out_tokens, out_logp, gen_lens, eos)


def _assemble(input_ids, prompt_lens, n, out_tokens, out_logp, gen_lens, eos) -> GenerationOutput:
    """Prompt-major packed sequences and log-probs aligned like ``packed_logprobs``."""
    device = input_ids.device
    prompts = torch.split(input_ids, prompt_lens)
    gl = gen_lens.tolist()
    seqs, logps, seqlens, plens = [], [], [], []
    for i, L in enumerate(gl):
        p = prompts[i // n]
        seqs += [p, out_tokens[i, :L]]
        logps += [torch.zeros(len(p) - 1, device=device), out_logp[i, :L]]
        seqlens.append(len(p) + L)
        plens.append(len(p))
    in_response = torch.arange(out_tokens.shape[1], device=device)[None, :] < gen_lens[:, None]
    has_eos = (
        (torch.isin(out_tokens, eos) & in_response).any(dim=1)
        if eos.numel()
        else torch.zeros_like(in_response[:, 0])
    )
    return GenerationOutput(
        sequences=torch.cat(seqs),
        seqlens=seqlens,
        prompt_lens=plens,
        logprobs=torch.cat(logps),
        no_eos=~has_eos,
    )
