"""Generation with a KV cache over packed prompts, no padding.

Prompts are prefilled in one packed forward; then each step feeds one token per live sequence.
A sequence that emits EOS leaves the live batch (its cache row is dropped), so finished
sequences stop costing compute. Log-probs are those of the sampled tokens under
``logits / temperature`` ("The N Implementation Details of RLHF with PPO", policy detail 1, "Scale
the logits by sampling temperature"), before top-k/top-p filtering, so a training forward
recomputes them exactly.

Sampling randomness is counter-based: each output sequence has a 64-bit key (its prompt's key
mixed with its answer index) and step ``s`` draws ``row_uniforms(keys, s)``, a hash of (key, s).
A sequence's tokens therefore depend on its key only, not on which other prompts share the batch,
their order, or the data-parallel rank that generates it.
"""

from __future__ import annotations

import torch

from realrl.api.core.model_api import GenerationHyperparameters, GenerationOutput
from realrl.impl.model.kernels import DecodeWeights
from realrl.impl.model.modules.attention import activation_dtype
from realrl.impl.model.modules.kv_cache import DecodeContext, KVCache, decode_attention_kernels
from realrl.impl.model.nn.transformer_block import linear
from realrl.impl.model.utils.logits_warper import warp_logits


def _eos_tensor(eos_token_id: int | list[int] | None, device) -> torch.Tensor:
    if eos_token_id is None:
        return torch.zeros(0, dtype=torch.long, device=device)
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device)


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _int64(x: int) -> int:
    """The low 64 bits of ``x`` as the signed value torch's int64 holds."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


# splitmix64's increment and finalizer multipliers ("Fast splittable pseudorandom number generators",
# Steele, Lea and Flood), as signed int64
_GOLDEN_U64 = 0x9E3779B97F4A7C15
_GOLDEN = _int64(_GOLDEN_U64)
_MUL1 = _int64(0xBF58476D1CE4E5B9)
_MUL2 = _int64(0x94D049BB133111EB)
# domain separation: a key's answer sub-keys and its per-step draws are different streams
_ANSWER_SALT = _int64(0x3C6EF372FE94F82B)
_STEP_SALT = _int64(0xA54FF53A5F1D36F1)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` on int64 is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 tensors: a bijection of 64-bit patterns whose outputs look
    independent for related inputs. Elementwise ops only (int64 products wrap), so it runs on any
    device without a host sync and can be captured in a CUDA graph."""
    x = (x ^ _shr(x, 30)) * _MUL1
    x = (x ^ _shr(x, 27)) * _MUL2
    return x ^ _shr(x, 31)


def derive_keys(keys: torch.Tensor, counter: torch.Tensor | int, salt: int) -> torch.Tensor:
    """Output ``counter`` of the splitmix64 stream seeded by ``mix64(keys ^ salt)``: a new key per
    (key, counter), injective in ``counter`` for a fixed key. ``salt`` separates uses of one key."""
    if isinstance(counter, torch.Tensor):
        offset = (counter + 1) * _GOLDEN  # wraps like the Python int below
    else:
        offset = _int64((counter + 1) * _GOLDEN_U64)
    return mix64(mix64(keys ^ salt) + offset)


def answer_keys(prompt_keys: torch.Tensor, n: int) -> torch.Tensor:
    """Keys of the ``n`` answers of each prompt, prompt-major: answer j of prompt i at ``i * n + j``."""
    j = torch.arange(n, device=prompt_keys.device).repeat(prompt_keys.shape[0])
    return derive_keys(prompt_keys.repeat_interleave(n), j, _ANSWER_SALT)


def random_keys(n: int) -> torch.Tensor:
    """``n`` int64 keys (on the CPU) from torch's global RNG, so ``torch.manual_seed`` makes a run
    reproducible."""
    return torch.randint(INT64_MIN, INT64_MAX, (n,), dtype=torch.long)


def row_uniforms(keys: torch.Tensor, step: torch.Tensor | int) -> torch.Tensor:
    """One uniform in [0, 1) per key for decoding step ``step`` (float64, 53 random bits), a pure
    function of (key, step): what a row samples does not depend on the other rows of its batch."""
    bits = _shr(derive_keys(keys, step, _STEP_SALT), 11)
    return bits.to(torch.float64) * 2.0**-53


def sample_categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row of ``probs`` [B, V] by inverting the CDF at the row's uniform ``u`` [B].

    Same distribution as ``torch.multinomial(probs, 1)`` when ``u`` is uniform, but takes B random
    numbers instead of B * V (multinomial's exponential race), which dominated the per-step
    sampling cost. Zero-probability tokens own empty CDF intervals and are never drawn: the point
    is kept strictly below the total, where rounding could otherwise land it past the last token.
    """
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    x = (u.view(-1, 1) * total.double()).to(cdf.dtype)
    x = torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _next_tokens(
    logits: torch.Tensor, g: GenerationHyperparameters, eos: torch.Tensor, step: int, keys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [B], its log-prob under logits / temperature [B]) for one step; row b samples with
    ``row_uniforms(keys, step)[b]``."""
    scaled = logits.float() if g.temperature == 1.0 else logits.float() / g.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    masked = step < g.min_new_tokens and eos.numel() > 0  # EOS is not allowed yet
    pick = scaled.index_fill(-1, eos, float("-inf")) if masked else scaled
    if g.greedy:
        tokens = pick.argmax(dim=-1)
    elif masked or g.top_k > 0 or g.top_p < 1.0:
        probs = torch.softmax(warp_logits(pick, g.top_k, g.top_p), dim=-1)
        tokens = sample_categorical(probs, row_uniforms(keys, step))
    else:  # plain sampling: the probabilities are exp(logp), no second softmax
        tokens = sample_categorical(logp.exp(), row_uniforms(keys, step))
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    gconfig: GenerationHyperparameters,
    eos_token_id: int | list[int] | None = None,
    prompt_keys: torch.Tensor | None = None,
) -> GenerationOutput:
    """Answers to the packed prompts; ``prompt_keys`` (int64 [n_prompts]) fix each prompt's sampling
    randomness (answer j of prompt i uses ``answer_keys(prompt_keys, n)[i * n + j]``); None draws
    them from torch's global RNG."""
    if model.config.is_critic:
        raise ValueError("generate() needs a language model; this ReaLModel is a critic (scalar head)")
    was_training = model.training
    model.eval()
    try:
        return _generate(model, input_ids, cu_seqlens, gconfig, eos_token_id, prompt_keys)
    finally:
        model.train(was_training)


def _generate(
    model,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    g: GenerationHyperparameters,
    eos_token_id: int | list[int] | None,
    prompt_keys: torch.Tensor | None,
) -> GenerationOutput:
    cfg, device, n = model.config, input_ids.device, g.n
    eos = _eos_tensor(eos_token_id, device)
    ctx = model.packed_context(input_ids, cu_seqlens)
    prompt_lens = ctx.meta.seqlens
    if min(prompt_lens) < 1:
        raise ValueError(f"generate() needs non-empty prompts; got prompt lengths {prompt_lens}")
    n_prompts, max_new = len(prompt_lens), g.max_new_tokens
    model.check_length(max(prompt_lens) + max_new, "prompt + max_new_tokens")
    if prompt_keys is None:  # greedy reads no randomness: the global RNG is left as it was
        prompt_keys = torch.zeros(n_prompts, dtype=torch.long) if g.greedy else random_keys(n_prompts)
    elif prompt_keys.shape != (n_prompts,) or prompt_keys.dtype != torch.long:
        raise ValueError(
            f"prompt_keys must be int64 [{n_prompts}] (one per prompt); got {prompt_keys.dtype} "
            f"{tuple(prompt_keys.shape)}"
        )
    keys = answer_keys(prompt_keys.to(device), n)  # row of the cache -> its sequence's key
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

    weights = DecodeWeights()  # decode-time projection weights, prepared once (kernels/weights.py)
    n_seqs = n_prompts * n
    live = torch.arange(n_seqs, device=device)  # row of the cache -> output sequence index
    out_tokens = torch.zeros(n_seqs, max_new, dtype=torch.long, device=device)
    out_logp = torch.zeros(n_seqs, max_new, dtype=torch.float32, device=device)
    gen_lens = torch.full((n_seqs,), max_new, dtype=torch.long, device=device)
    with decode_attention_kernels(device):
        for step in range(max_new):
            tokens, logp = _next_tokens(logits, g, eos, step, keys)
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
                    live, keys, tokens, lens = live[keep], keys[keep], tokens[keep], lens[keep]
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
