"""Policy losses that reshape PPO's surrogate -A * r (verl's ``core_algos.py`` names):

  geo_mean  GMPO: one ratio per answer, the geometric mean of its clipped token ratios
            "Geometric-Mean Policy Optimization" (Zhao et al. 2025)
  sapo      a smooth sigmoid gate on the ratio instead of the hard clip
            "Soft Adaptive Policy Optimization" (Gao et al. 2025)
  clip_cov  PPO's clipped surrogate with the gradient cut on a few random tokens of high
            covariance between advantage and log-probability
  kl_cov    the unclipped surrogate with a |log r| penalty on the tokens of largest covariance
            (both: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
            Models", Cui et al. 2025)

r_t = exp(logp_t - logp_old_t) (log bounded to +-20). Each function has the signature and
returns of ``policy_losses.PolicyLossFn``; the per-token loss is 0 off the mask. clip_cov and
kl_cov pick their tokens among the response tokens of the batch they are given (a micro-batch,
as in verl).
"""

from __future__ import annotations

import torch
from torch import Tensor

from realrl.impl.model.utils.advantages import sequence_ids
from realrl.impl.model.utils.policy_losses import PolicyLossConfig, ratio_stats, token_ratio
from realrl.impl.model.utils.ppo_functional import masked_mean


def _per_sequence_mean(x: Tensor, mask: Tensor, seq_ids: Tensor, n_seqs: int) -> Tensor:
    """[N]: the mean of x over each sequence's masked tokens (0 for a sequence without any)."""
    m = mask.to(x.dtype)
    zeros = torch.zeros(n_seqs, dtype=x.dtype, device=x.device)
    return zeros.index_add(0, seq_ids, x * m) / zeros.index_add(0, seq_ids, m).clamp(min=1.0)


def geo_mean_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO: the geometric mean of the token ratios of answer i, each clipped in log space the
    pessimistic way (s_t = sign(A_t), x_t = log r_t):

        x~_t = s_t * min(s_t * x_t, s_t * clip(x_t, -eps_low, eps_high))
        R_i  = exp(mean_t x~_t),   A_i = mean_t A_t,   L_i = -A_i * R_i

    verl takes mean_i L_i whatever the aggregation; here every response token of answer i
    carries L_i, so ``seq-mean-token-mean`` (the ``gmpo`` preset) gives exactly that, and the
    token modes weigh answers by length. ``clip_frac`` / ``clip_frac_lower``: tokens whose log
    ratio left the range with A > 0 / A < 0 (verl's pg_clipfrac / pg_clipfrac_lower)."""
    mask = loss_mask.bool()
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    sign = torch.sign(advantages)
    bounded = log_ratio.clamp(-cfg.eps_clip_low, cfg.eps_clip_high)
    pessimistic = sign * torch.min(sign * log_ratio, sign * bounded)
    seq_ids = sequence_ids(short_cu_seqlens.to(logprobs.device))
    n_seqs = short_cu_seqlens.shape[0] - 1
    seq_ratio = torch.exp(_per_sequence_mean(pessimistic, mask, seq_ids, n_seqs))
    seq_adv = _per_sequence_mean(advantages, mask, seq_ids, n_seqs)
    per_seq = -seq_adv * seq_ratio
    loss = torch.where(mask, per_seq[seq_ids], torch.zeros_like(logprobs))
    clipped = (log_ratio != bounded).detach()
    stats = {
        "clip_frac": masked_mean((clipped & (advantages > 0)).float(), mask),
        "clip_frac_lower": masked_mean((clipped & (advantages < 0)).float(), mask),
    }
    return loss, {**stats, **ratio_stats(ratio, log_ratio, mask)}


def sapo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO: a soft trust region. The ratio passes through a sigmoid gate

        f(r, tau) = sigmoid(tau * (r - 1)) * 4 / tau,   l_t = -f(r_t, tau_t) * A_t

    with tau_t = tau_pos where A_t > 0, tau_neg otherwise (``options``). f'(1) = 1: on policy
    the gradient is the plain policy gradient's; it fades smoothly as r leaves 1 (faster for
    larger tau) instead of stopping at a clip. verl aggregates it with ``seq-mean-token-mean``
    (the ``sapo`` preset). Nothing is clipped: ``clip_frac`` is 0."""
    mask = loss_mask.bool()
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    opts = cfg.options
    tau = torch.where(advantages > 0, opts.tau_pos, opts.tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    loss = torch.where(mask, -gate * advantages, torch.zeros_like(logprobs))
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    return loss, {"clip_frac": zero, **ratio_stats(ratio, log_ratio, mask)}


def covariance(advantages: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per token, the centred product (A_t - mean A) * (logp_t - mean logp) over the response
    tokens (no gradient): a token's share of cov(A, logp), whose sign drives entropy down."""
    logp = logprobs.detach()
    return (advantages - masked_mean(advantages, mask)) * (logp - masked_mean(logp, mask))


def clip_cov_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov: PPO's clipped surrogate (no dual clip) with the gradient cut on

        n = max(1, floor(clip_cov_ratio * #response tokens))

    tokens drawn at random among the response tokens PPO does not already clip whose covariance
    (``covariance``) lies in (clip_cov_lb, clip_cov_ub):  l_t = max(-A r, -A clip(r)) * c_t, c_t =
    0 on the drawn tokens, 1 elsewhere. ``clip_frac``: the drawn fraction (verl's pg_clipfrac);
    ``ppo_clip_frac``: the fraction PPO's clip holds."""
    mask = loss_mask.bool()
    opts = cfg.options
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * ratio.clamp(1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high)
    ppo_clipped = (pg_loss2 > pg_loss1).detach() & mask
    cov = covariance(advantages, logprobs, mask)
    candidates = mask & ~ppo_clipped & (cov > opts.clip_cov_lb) & (cov < opts.clip_cov_ub)
    n_cut = max(int(opts.clip_cov_ratio * int(mask.sum())), 1)
    idx = candidates.nonzero().squeeze(-1)
    drawn = idx[torch.randperm(idx.numel(), device=idx.device)[:n_cut]]
    keep = torch.ones_like(logprobs).index_fill(0, drawn, 0.0)
    loss = torch.where(mask, torch.max(pg_loss1, pg_loss2) * keep, torch.zeros_like(logprobs))
    stats = {
        "clip_frac": masked_mean(1.0 - keep, mask),
        "ppo_clip_frac": masked_mean(ppo_clipped.float(), mask),
    }
    return loss, {**stats, **ratio_stats(ratio, log_ratio, mask)}


def kl_cov_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov: the unclipped surrogate, with a KL-like penalty on the

        k = max(1, floor(kl_cov_ratio * #response tokens))

    response tokens of largest covariance (``covariance``):

        l_t = -A_t * r_t + ppo_kl_coef * |logp_t - logp_old_t| * [t among the k]

    ``kl_cov_frac``: the penalised fraction; ``abs_kl``: the masked mean of |log r| (what verl
    reports as ppo_kl for this loss). Nothing is clipped: ``clip_frac`` is 0."""
    mask = loss_mask.bool()
    opts = cfg.options
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    idx = mask.nonzero().squeeze(-1)
    k = max(int(idx.numel() * opts.kl_cov_ratio), 1) if idx.numel() > 0 else 0
    top = idx[torch.topk(covariance(advantages, logprobs, mask)[idx], k).indices]
    penalised = torch.zeros_like(logprobs).index_fill(0, top, 1.0)
    loss = -advantages * ratio + opts.ppo_kl_coef * log_ratio.abs() * penalised
    loss = torch.where(mask, loss, torch.zeros_like(logprobs))
    stats = {
        "clip_frac": torch.zeros((), dtype=loss.dtype, device=loss.device),
        "kl_cov_frac": masked_mean(penalised, mask),
        "abs_kl": masked_mean(log_ratio.abs().detach(), mask),
    }
    return loss, {**stats, **ratio_stats(ratio, log_ratio, mask)}
