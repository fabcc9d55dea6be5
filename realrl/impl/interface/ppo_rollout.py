"""From generation to advantages: the data side of PPO / GRPO shared by actor and critic.

``rollout_sample`` turns a ``GenerationOutput`` into the rollout keys (after the optional
truncation of "The N Implementation Details of RLHF with PPO", PPO detail 5; "PPO detail N"
below is item N of its "Policy Training Implementation Details"); ``shape_scores`` turns
``rewards`` into the score PPO optimises (``ppo_advantages`` computes the advantages from it once
per batch). The key lists of the PPO-family graphs are in ``ppo_keys``.
"""

from __future__ import annotations

from typing import Any

import torch

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import GenerationOutput
from realrl.impl.interface.common import INPUT_KEY, per_sequence_sample, token_sample
from realrl.impl.interface.ppo_config import PPOHyperparameters
from realrl.impl.interface.ppo_keys import BEHAV_VERSION, ROLLOUT_KEYS, ROUTED_EXPERTS, SCORE_KEYS
from realrl.impl.model.utils import ppo_functional as F


def stamp_version(out: SequenceSample, versions: torch.Tensor) -> None:
    """Give every answer of ``out`` (prompt-major) the version of the policy that sampled it,
    ``versions`` [n_answers] (in place)."""
    device = out.data[INPUT_KEY].device
    out.update_(per_sequence_sample(out, BEHAV_VERSION, versions.to(device=device, dtype=torch.long)))


def answer_version_span(
    gen: GenerationOutput, token_versions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(oldest, newest) policy version among each answer's tokens, from ``token_versions``
    aligned like ``gen.logprobs`` (an answer's tokens are the last L - p entries of its L - 1)."""
    oldest, newest, off = [], [], 0
    for L, p in zip(gen.seqlens, gen.prompt_lens):
        answer = token_versions[off + p - 1 : off + L - 1]
        off += L - 1
        oldest.append(int(answer.min()) if answer.numel() else 0)
        newest.append(int(answer.max()) if answer.numel() else 0)
    return torch.tensor(oldest, dtype=torch.long), torch.tensor(newest, dtype=torch.long)


def resolve_token_id(tokenizer: Any, token: int | str | None, what: str) -> int | None:
    """A token given as an id or as text that the tokenizer maps to exactly one id."""
    if token is None or isinstance(token, int):
        return token
    if tokenizer is None:
        raise ValueError(f"{what}={token!r} is text but the model has no tokenizer; give a token id")
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"{what}={token!r} encodes to {len(ids)} tokens {ids}; it must be exactly one")
    return int(ids[0])


def truncate_generation(gen: GenerationOutput, token_id: int, after: int) -> GenerationOutput:
    """PPO detail 5, "token truncation": cut each response just after the first
    ``token_id`` at response position >= ``after``; a cut response counts as ended (no_eos 0)."""
    seqs, lps, envs, lens, no_eos, routed = [], [], [], [], gen.no_eos.clone(), []
    env_mask = gen.env_mask if gen.env_mask is not None else torch.zeros_like(gen.sequences, dtype=torch.bool)
    off_t = off_l = 0
    for i, (L, p) in enumerate(zip(gen.seqlens, gen.prompt_lens)):
        s, lp = gen.sequences[off_t : off_t + L], gen.logprobs[off_l : off_l + L - 1]
        env = env_mask[off_t : off_t + L]
        start = off_t
        off_t, off_l = off_t + L, off_l + L - 1
        hits = ((s[p + after :] == token_id) & ~env[p + after :]).nonzero()  # the model's tokens only
        if hits.numel():
            L = p + after + int(hits[0, 0]) + 1
            s, lp, env = s[:L], lp[: L - 1], env[:L]
            no_eos[i] = False
        seqs.append(s)
        lps.append(lp)
        envs.append(env)
        lens.append(L)
        if gen.routed_experts is not None:  # a cut answer's last token was fed: its record stays
            routed.append(gen.routed_experts[start : start + L])
    return GenerationOutput(
        sequences=torch.cat(seqs),
        seqlens=lens,
        prompt_lens=list(gen.prompt_lens),
        logprobs=torch.cat(lps),
        no_eos=no_eos,
        env_mask=torch.cat(envs) if gen.env_mask is not None else None,
        routed_experts=torch.cat(routed) if routed else None,
    )


def rollout_sample(data: SequenceSample, gen: GenerationOutput) -> SequenceSample:
    """The rollout keys, one sample per prompt holding its ``n`` answers (prompt-major order)."""
    n_prompts = data.bs
    if len(gen.seqlens) % n_prompts:
        raise ValueError(f"generation returned {len(gen.seqlens)} sequences for {n_prompts} prompts")
    n = len(gen.seqlens) // n_prompts
    rows = [gen.seqlens[i * n : (i + 1) * n] for i in range(n_prompts)]
    out = SequenceSample(
        keys=set(ROLLOUT_KEYS),
        trailing_shapes={k: () for k in ROLLOUT_KEYS},
        dtypes={
            "packed_input_ids": torch.long,
            "packed_logprobs": torch.float32,
            "prompt_mask": torch.bool,
            "seq_no_eos_mask": torch.bool,
        },
        ids=list(data.ids),
        seqlens={
            "packed_input_ids": rows,
            "prompt_mask": rows,
            "packed_logprobs": [[x - 1 for x in r] for r in rows],
            "seq_no_eos_mask": [[1] * n for _ in rows],
        },
        data={
            "packed_input_ids": gen.sequences.long(),
            "packed_logprobs": gen.logprobs.float(),
            "prompt_mask": gen.prompt_mask().bool(),
            "seq_no_eos_mask": gen.no_eos.bool(),
        },
        metadata={k: list(v) for k, v in data.metadata.items()},
    )
    if gen.routed_experts is not None:  # router replay: the experts the decoder routed each token to
        out.update_(token_sample(out, ROUTED_EXPERTS, gen.routed_experts))
    return out


def _responses_missing_truncation(data: SequenceSample, token_id: int, after: int) -> torch.Tensor:
    """bool [n_seqs]: the response does not end with ``token_id`` at position >= ``after``."""
    cu = data.cu_seqlens(INPUT_KEY).to(data.data[INPUT_KEY].device)
    ids, pm = data.data[INPUT_KEY], data.data["prompt_mask"].long()
    last = (cu[1:] - 1).long()
    prompt_lens = torch.zeros(len(last), dtype=torch.long, device=ids.device).index_add_(
        0, torch.repeat_interleave(torch.arange(len(last), device=ids.device), (cu[1:] - cu[:-1]).long()), pm
    )
    response_lens = (cu[1:] - cu[:-1]).long() - prompt_lens
    found = (ids[last] == token_id) & (response_lens - 1 >= after) & (response_lens > 0)
    return ~found


def shape_scores(
    hp: PPOHyperparameters, data: SequenceSample, truncate_id: int | None
) -> tuple[torch.Tensor, dict]:
    """The per-sequence score PPO optimises, from the task's reward (``rewards``, plus a
    multi-turn trajectory's ``env_rewards``): scale and bias -> truncation penalty (PPO detail 5:
    score := penalty) -> missing-EOS penalty (score -= p) or zeroing -> clipping into
    [-max_reward_clip, max_reward_clip]."""
    raw = task_rewards(data)
    no_eos = data.data["seq_no_eos_mask"].bool()
    score = raw * hp.reward_output_scaling + hp.reward_output_bias
    stats: dict[str, float] = {"task_reward": float(raw.mean()), "no_eos_frac": float(no_eos.float().mean())}
    if hp.truncate_penalty is not None and truncate_id is not None:
        missing = _responses_missing_truncation(data, truncate_id, hp.truncate_after)
        score = torch.where(missing, torch.full_like(score, hp.truncate_penalty), score)
        stats["truncation_penalized_frac"] = float(missing.float().mean())
    if hp.missing_eos_penalty is not None:
        score = score - hp.missing_eos_penalty * no_eos.float()
    if hp.mask_no_eos_with_zero:
        score = torch.where(no_eos, torch.zeros_like(score), score)
    score = F.clip_rewards(score, hp.max_reward_clip)
    stats["score"] = float(score.mean())
    return score, stats


def task_rewards(data: SequenceSample) -> torch.Tensor:
    """Each answer's reward: the sum of the scores it has (``SCORE_KEYS``)."""
    present = [data.data[k].float() for k in SCORE_KEYS if k in data.keys and data.data[k] is not None]
    if not present:
        raise ValueError(f"the batch has no score: none of {SCORE_KEYS} (has {sorted(data.keys)})")
    return torch.stack(present).sum(0)


def rollout_kl(data: SequenceSample) -> tuple[float, int]:
    """Mean over sequences of the summed k1 KL(pi_old || pi_ref) on response tokens, and the
    number of sequences: what the adaptive KL controller is updated with."""
    logp = data.data["packed_logprobs"]
    cu = data.cu_seqlens(INPUT_KEY).to(logp.device)
    mask = F.response_loss_mask(data.data["prompt_mask"], cu)
    kl = (logp - data.data["packed_ref_logprobs"]) * mask
    lens = torch.tensor([n - 1 for n in data.flat_seqlens(INPUT_KEY)], device=logp.device)
    seg = torch.repeat_interleave(torch.arange(len(lens), device=logp.device), lens)
    per_seq = torch.zeros(len(lens), device=logp.device).index_add_(0, seg, kl.float())
    return float(per_seq.mean()), len(lens)


def overlong_penalties(
    loss_mask: torch.Tensor, cu_seqlens: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float
) -> torch.Tensor:
    """DAPO's overlong reward shaping ("DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale", soft overlong punishment), per sequence: 0 up to ``max_new_tokens - buffer`` response
    tokens, then growing linearly to ``penalty`` at ``max_new_tokens``."""
    short = F.short_cu_seqlens(cu_seqlens.to(loss_mask.device)).long()
    n = short.shape[0] - 1
    seq = torch.repeat_interleave(torch.arange(n, device=short.device), short[1:] - short[:-1])
    lengths = torch.zeros(n, device=short.device).index_add_(0, seq, loss_mask.float())
    over = (lengths - (max_new_tokens - buffer)) / max(buffer, 1)
    return over.clamp(0.0, 1.0) * penalty


def shuffled_minibatches(
    samples: list[SequenceSample], n_minibatches: int, generator: torch.Generator
) -> list[SequenceSample]:
    """PPO detail 7: a fresh permutation of the samples (``batch.unpack()``, unpacked
    once for all epochs), cut into ``n_minibatches`` near-equal groups (a GRPO group is one
    sample, so it is never split)."""
    perm = torch.randperm(len(samples), generator=generator).tolist()
    n = min(n_minibatches, len(samples))
    return [
        SequenceSample.gather([samples[i] for i in chunk.tolist()])
        for chunk in torch.tensor_split(torch.tensor(perm), n)
    ]
