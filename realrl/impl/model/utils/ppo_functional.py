"""PPO and GRPO math over packed sequences, each piece readable top to bottom.

Alignment (the key contract of docs/datasets.md): a sequence of L tokens has L ``values`` (value
after each token) and L - 1 entries of every "token minus one" key (``packed_logprobs``,
``advantages``, ``returns``, ``kl_rewards``): element j is about generating token j + 1.
``cu_seqlens`` below is always the token-level boundary of ``packed_input_ids``; the "short"
boundaries of the L - 1 keys follow from it. Details of the blog post "The N Implementation
Details of RLHF with PPO" (Huang et al., ICLR blog track 2024) are cited by name: "PPO detail N"
refers to item N of its numbered list "Policy Training Implementation Details", "general detail
N" and "RM detail N" to its "General" and "Reward Model" lists likewise.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import torch

KLEstimator = Literal["k1", "k2", "k3"]


# ----------------------------------------------------------------------------- packing helpers


def short_cu_seqlens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Boundaries of the L - 1 keys: each sequence loses one entry."""
    n = torch.arange(cu_seqlens.shape[0], device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return cu_seqlens - n


def last_indices(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Index of the last element of each sequence in a packed tensor with these boundaries."""
    return (cu_seqlens[1:] - 1).long()


def response_loss_mask(prompt_mask: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """bool [T - B] (``ppo_loss_mask``): True where token j + 1 is a response token.

    ``prompt_mask`` is per token (True on prompt tokens); dropping the first token of each
    sequence aligns "token j + 1" with entry j.
    """
    keep = torch.ones(prompt_mask.shape[0], dtype=torch.bool, device=prompt_mask.device)
    keep[cu_seqlens[:-1].long()] = False
    return ~prompt_mask.bool()[keep]


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


# ----------------------------------------------------------------------------- whitening


def whiten(values: torch.Tensor, shift_mean: bool = True, mask: torch.Tensor | None = None) -> torch.Tensor:
    """PPO detail "per-minibatch reward and advantage whitening" (OpenAI's ``whiten``).

    Biased variance (``unbiased=False``, the TF ``tf.nn.moments`` behaviour) and eps 1e-8.
    ``shift_mean=False`` adds the mean back (used for rewards); with a mask the moments are taken
    over masked entries only and unmasked entries come back as 0.
    """
    if mask is None:
        mean, var = torch.mean(values), torch.var(values, unbiased=False)
    else:
        m = mask.to(values.dtype)
        mean = masked_mean(values, m)
        var = masked_mean((values - mean) ** 2, m)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    if mask is not None:
        whitened = whitened * mask.to(values.dtype)
    return whitened


# ----------------------------------------------------------------------------- KL controllers


class FixedKLController:
    """A constant KL coefficient beta (ReaL's default, ``kl_ctl=0.1``)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current: float, n_steps: int) -> None:
        return None


class AdaptiveKLController:
    """PPO detail "adaptive KL" (Ziegler et al. 2019, train_policy.py#L115-L124):

    e = clip(KL_current / KL_target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n_steps / horizon)
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise ValueError(
                f"AdaptiveKLController needs target > 0 and horizon > 0, got {target}, {horizon}"
            )
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current: float, n_steps: int) -> None:
        proportional_error = float(np.clip(current / self.target - 1, -0.2, 0.2))
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


# ----------------------------------------------------------------------------- KL penalty and rewards


def kl_divergence(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k1"):
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1 / k2 / k3).

    k1 = log r          (r = pi / pi_ref; unbiased, can be negative; lm-human-preferences)
    k2 = (log r)^2 / 2
    k3 = (1/r - 1) + log r  = exp(-log r) - 1 + log r    (unbiased, always >= 0; GRPO)
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")


def packed_kl_rewards(
    kl_coef: float,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    scores: torch.Tensor,
    cu_seqlens: torch.Tensor,
    loss_mask: torch.Tensor,
    estimator: KLEstimator = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO detail "per-token KL penalty": rewards = -beta * KL per response token, and
    the sequence's score added at its last token. Returns (kl_rewards, rewards), both [T - B]."""
    kl_rewards = -kl_coef * kl_divergence(logprobs, ref_logprobs, estimator) * loss_mask
    rewards = kl_rewards.clone()
    rewards[last_indices(short_cu_seqlens(cu_seqlens))] += scores.to(rewards.dtype)
    return kl_rewards, rewards


def clip_rewards(scores: torch.Tensor, max_abs: float | None) -> torch.Tensor:
    """Reward clipping (ReaL's ``max_reward_clip``): scores into [-max_abs, max_abs]."""
    if max_abs is None:
        return scores
    return scores.clamp(-max_abs, max_abs)


# ----------------------------------------------------------------------------- advantages


def packed_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bootstrap: torch.Tensor,
    gamma: float,
    lam: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over packed sequences (PPO detail "discount
    factor = 1" makes gamma = 1 the default elsewhere).

    rewards [T - B], values [T] (value after each token), bootstrap [B]: 1 where the sequence was
    cut by the length limit (``seq_no_eos_mask``), so its last value stands in for the future;
    0 where it ended, so the future is worth 0.

        delta_t = r_t + gamma * V_{t+1} - V_t          (V_{t+1} of the last step = bootstrap * V_last)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t
    Sequences are padded into a [B, max L - 1] grid so the backward recursion runs over time
    only; padded cells have r = V = 0, so they contribute 0.

    ``mask`` [T - B] (the loss mask): only the model's steps are steps. A step the model did not
    take (a prompt token, a multi-turn trajectory's observation) is skipped: the recursion carries
    over it, and V_{t+1} of the model's step before it is the value where the model acts next, after
    the observation (verl's multi-turn GAE does the same); skipped steps get advantage 0. A
    response that is one block at the end, as single-turn generation makes it, gets the same
    advantages either way.
    """
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    n_steps = lens - 1
    bsz, max_steps = lens.shape[0], int(n_steps.max()) if lens.numel() else 0
    dev, dt = values.device, values.dtype
    rows = torch.repeat_interleave(torch.arange(bsz, device=dev), n_steps)
    short = short_cu_seqlens(cu_seqlens).long()
    cols = torch.arange(int(short[-1]), device=dev) - torch.repeat_interleave(short[:-1], n_steps)
    token_pos = cu_seqlens[:-1].long()[rows] + cols  # packed index of the state before step t

    r = torch.zeros(bsz, max_steps, dtype=dt, device=dev)
    v = torch.zeros_like(r)
    v_next = torch.zeros_like(r)
    r[rows, cols] = rewards.to(dt)
    v[rows, cols] = values[token_pos]
    v_next[rows, cols] = values[token_pos + 1]
    last = (lens - 2).clamp(min=0)
    has_steps = n_steps > 0
    v_next[torch.arange(bsz, device=dev)[has_steps], last[has_steps]] *= bootstrap.to(dt)[has_steps]

    adv = torch.zeros_like(r)
    running = torch.zeros(bsz, dtype=dt, device=dev)
    if mask is None:
        for t in reversed(range(max_steps)):
            delta = r[:, t] + gamma * v_next[:, t] - v[:, t]
            running = delta + gamma * lam * running
            adv[:, t] = running
    else:
        acts = torch.zeros(bsz, max_steps, dtype=torch.bool, device=dev)
        acts[rows, cols] = mask.to(dev).bool()
        next_value = torch.zeros(bsz, dtype=dt, device=dev)  # V where the model acts next
        for t in reversed(range(max_steps)):
            next_value = torch.where(t == last, v_next[:, t], next_value)
            delta = r[:, t] + gamma * next_value - v[:, t]
            running = torch.where(acts[:, t], delta + gamma * lam * running, running)
            adv[:, t] = torch.where(acts[:, t], running, torch.zeros_like(running))
            next_value = torch.where(acts[:, t], v[:, t], next_value)
    advantages = adv[rows, cols]
    return advantages, advantages + v[rows, cols]


def group_normalized_advantages(
    scores: torch.Tensor, group_sizes: list[int], scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: A_i = (s_i - mean(group)) / (std(group) + eps), one scalar per sequence.

    A group is the K answers of one prompt (one ``SequenceSample`` sample). ``std`` is the
    unbiased sample std as in DeepSeekMath / TRL; ``scale_by_std=False`` keeps only the mean
    shift (Dr. GRPO). A group of one gets advantage 0.
    """
    out = torch.zeros_like(scores, dtype=torch.float32)
    start = 0
    for k in group_sizes:
        s = scores[start : start + k].float()
        if k > 1:
            a = s - s.mean()
            if scale_by_std:
                a = a / (s.std() + eps)
            out[start : start + k] = a
        start += k
    return out


# ----------------------------------------------------------------------------- losses


def critic_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_eps_clip: float | None,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO detail "clipped value function" (as in baselines ppo2):

    V_clip = V_old + clip(V - V_old, -eps, eps);   L = 0.5 * mean( max((V - R)^2, (V_clip - R)^2) )
    ``value_eps_clip=None`` gives the plain squared error.
    """
    mask = loss_mask.bool()
    loss_unclipped = (values - returns) ** 2
    if value_eps_clip is None:
        loss_tok, clip_frac = loss_unclipped, torch.zeros((), device=values.device)
    else:
        v_clipped = old_values + (values - old_values).clamp(-value_eps_clip, value_eps_clip)
        loss_clipped = (v_clipped - returns) ** 2
        loss_tok = torch.max(loss_unclipped, loss_clipped)
        clip_frac = masked_mean((loss_clipped > loss_unclipped).float().detach(), mask)
    loss = 0.5 * masked_mean(loss_tok, mask)
    return loss, {"value_clip_frac": clip_frac}


# ----------------------------------------------------------------------------- value normalisation


@dataclasses.dataclass
class RunningMeanStd:
    """Running moments of the returns for value normalisation (ReaL's ``value_norm``).

    ``beta`` < 1: exponential moving average with debiasing (ReaL's "exp" type); ``beta`` = 1:
    a plain cumulative average ("ma"). The critic learns normalise(returns); its outputs are
    de-normalised before anyone else sees them.
    """

    beta: float = 0.99995
    eps: float = 1e-5
    mean: float = 0.0
    mean_sq: float = 0.0
    debias: float = 0.0
    count: float = 0.0

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        m = torch.ones_like(x) if mask is None else mask.to(x.dtype)
        n = float(m.sum())
        if n == 0:
            return
        batch_mean = float((x * m).sum()) / n
        batch_mean_sq = float((x**2 * m).sum()) / n
        if self.beta < 1:
            self.mean = self.beta * self.mean + (1 - self.beta) * batch_mean
            self.mean_sq = self.beta * self.mean_sq + (1 - self.beta) * batch_mean_sq
            self.debias = self.beta * self.debias + (1 - self.beta)
        else:
            total = self.count + n
            self.mean = (self.mean * self.count + batch_mean * n) / total
            self.mean_sq = (self.mean_sq * self.count + batch_mean_sq * n) / total
            self.debias = 1.0
        self.count += n

    def mean_std(self) -> tuple[float, float]:
        if self.debias == 0:
            return 0.0, 1.0
        mean = self.mean / max(self.debias, self.eps)
        var = max(self.mean_sq / max(self.debias, self.eps) - mean**2, 1e-2)
        return mean, var**0.5

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean_std()
        return (x - mean) / std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean_std()
        return x * std + mean
