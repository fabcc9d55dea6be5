"""Sampling a token per sequence with counter-based randomness.

Each output sequence has a 64-bit key (its prompt's key mixed with its answer index) and decoding
step ``s`` draws ``row_uniforms(keys, s)``, a hash of (key, s). A sequence's tokens therefore
depend on its key only, not on which other prompts share the batch, their order, or the
data-parallel rank that generates it; and the draws are elementwise tensor ops, so a step with a
tensor ``s`` runs inside a CUDA graph (``nn/static_decode.py``).

The tensor-parallel ranks of one model replica decode the same batch and must feed the same
tokens to their next collective, yet each samples from its own copy of the logits: a CUDA float
``cumsum`` (the CDF) is not deterministic, and one rank drawing another token would split the
ranks' batches (one drops a row at EOS, the other does not) and hang the next all-reduce. So
with a ``group`` of more than one rank, ``next_tokens`` hands every rank the tokens its first
rank drew (one broadcast of int64 ids per step); each rank's log-probs are then those of the
agreed tokens. Without a group nothing is communicated.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.utils.logits_warper import warp_logits


def eos_tensor(eos_token_id: int | list[int] | None, device) -> torch.Tensor:
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


def is_eos(tokens: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """bool [B]: each token is one of the EOS ids. An explicit comparison, not ``torch.isin``,
    which sorts for large inputs and then cannot run inside a CUDA graph (PyTorch issue
    "cuda graph error for torch.isin if the input tensors are too large")."""
    return (tokens[:, None] == eos[None, :]).any(dim=-1)


def first_rank_tokens(tokens: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The tokens [B] that the first rank of ``group`` sampled, on every rank of it (one broadcast
    over ``group``, whose ranks all call this at the same step); ``tokens`` itself without a group."""
    if group is None:
        return tokens
    tokens = tokens.contiguous()
    dist.broadcast(tokens, group_src=0, group=group)
    return tokens


def next_tokens(
    logits: torch.Tensor,
    g: GenerationHyperparameters,
    eos: torch.Tensor,
    step: int | torch.Tensor,
    keys: torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [B], its log-prob under logits / temperature [B]) for decoding step ``step``; row b
    samples with ``row_uniforms(keys, step)[b]``. ``step`` is an int (the eager loop) or a 0-dim
    long tensor (a captured step): both give the same tokens, as the way of sampling is chosen by
    ``g`` alone and the step only decides, as a value, whether EOS is still banned. ``group``: the
    tensor-parallel ranks that decode this batch together, which all take its first rank's tokens
    (``first_rank_tokens``); None on one rank."""
    scaled = logits.float() if g.temperature == 1.0 else logits.float() / g.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    bans_eos = g.min_new_tokens > 0 and eos.numel() > 0
    pick = scaled
    if bans_eos:  # EOS is not allowed before min_new_tokens
        banned = scaled.index_fill(-1, eos, float("-inf"))
        if isinstance(step, torch.Tensor):
            pick = torch.where(step < g.min_new_tokens, banned, scaled)
        elif step < g.min_new_tokens:
            pick = banned
    if g.greedy:
        tokens = pick.argmax(dim=-1)
    elif bans_eos or g.top_k > 0 or g.top_p < 1.0:
        probs = torch.softmax(warp_logits(pick, g.top_k, g.top_p), dim=-1)
        tokens = sample_categorical(probs, row_uniforms(keys, step))
    else:  # plain sampling: the probabilities are exp(logp), no second softmax
        tokens = sample_categorical(logp.exp(), row_uniforms(keys, step))
    tokens = first_rank_tokens(tokens, group)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
