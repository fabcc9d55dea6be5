"""Policy losses of the form "weighted log-likelihood": l_t = -sg[w_t] * A_t * logp_t (+ a penalty).

Their gradient is w_t * A_t * grad logp_t, a policy gradient whose importance weight w_t carries
no gradient; they differ in w_t (all registered in ``rl_registry`` under verl's names, with
verl's ``core_algos.py`` as the reference implementation):

  gpg      w = 1                                "GPG: A Simple and Strong Reinforcement Learning
                                                Baseline for Model Reasoning" (Chu et al. 2025)
  cispo    w = clip(r, 1 - eps_low, 1 + eps_high)   "MiniMax-M1: Scaling Test-Time Compute
                                                Efficiently with Lightning Attention" (2025)
  dppo_tv  w = min(r, c) * [the token stays in a total-variation trust region]
  dppo_kl  w = min(r, c) * [the token stays in a binary-KL trust region]
                                                "Rethinking the Trust Region in LLM Reinforcement
                                                Learning" (Qi et al. 2026)
  dro      w = 1, plus beta/2 * (logp - logp_old)^2   "Offline Regularised Reinforcement Learning
                                                for Large Language Models Alignment" (Richemond
                                                et al. 2024), as "Kimi k1.5: Scaling
                                                Reinforcement Learning with LLMs" (2025) uses it

r_t = exp(logp_t - logp_old_t) (log bounded to +-20). Each function has the signature and
returns of ``policy_losses.PolicyLossFn``; the per-token loss is 0 off the mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from realrl.impl.model.utils.policy_losses import PolicyLossConfig, ratio_stats, token_ratio
from realrl.impl.model.utils.ppo_functional import masked_mean

# verl's cap on DPPO's importance weight when clip_ratio_c is unset (the paper advises a large one)
DPPO_DEFAULT_RATIO_CAP = 20.0
# verl's guard against log(0) in the binary KL of a token whose probability is 1
BINARY_KL_EPS = 1e-8


def weighted_log_likelihood(weight: Tensor, advantages: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """l_t = -sg[w_t] * A_t * logp_t on the mask, 0 off it."""
    loss = -weight.detach() * advantages * logprobs
    return torch.where(mask, loss, torch.zeros_like(loss))


def _zero(like: Tensor) -> Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def gpg_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG: the plain policy gradient, no ratio, no clip:  l_t = -A_t * logp_t.

    ``old_logprobs`` only feed the statistics (``clip_frac`` is 0)."""
    mask = loss_mask.bool()
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    loss = weighted_log_likelihood(torch.ones_like(ratio), advantages, logprobs, mask)
    return loss, {"clip_frac": _zero(loss), **ratio_stats(ratio, log_ratio, mask)}


def cispo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: clip the importance weight, not the update:

        l_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] * A_t * logp_t

    Unlike PPO's surrogate, a clipped token still passes a gradient (scaled by the clipped
    weight). MiniMax-M1 sets no lower bound (``eps_clip_low >= 1``; verl's example: 10).
    ``clip_frac``: the fraction of tokens whose weight was clipped."""
    mask = loss_mask.bool()
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    clipped = ratio.clamp(1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high)
    loss = weighted_log_likelihood(clipped, advantages, logprobs, mask)
    clip_frac = masked_mean((ratio != clipped).float().detach(), mask)
    return loss, {"clip_frac": clip_frac, **ratio_stats(ratio, log_ratio, mask)}


def dro_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DRO: the policy gradient with a quadratic proximal penalty instead of a clip:

        l_t = -(A_t * logp_t - beta / 2 * (logp_t - logp_old_t)^2),   beta = dro_beta > 0

    The penalty's gradient beta * (logp - logp_old) pulls the policy back towards the sampler;
    at logp = logp_old the gradient is GPG's. ``dro_penalty``: the masked mean of the penalty."""
    beta = cfg.options.dro_beta
    if beta is None:
        raise ValueError("policy loss 'dro' needs options.dro_beta > 0")
    mask = loss_mask.bool()
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    penalty = 0.5 * beta * (logprobs - old_logprobs) ** 2
    loss = torch.where(mask, -advantages * logprobs + penalty, torch.zeros_like(logprobs))
    stats = {"clip_frac": _zero(loss), "dro_penalty": masked_mean(penalty.detach(), mask)}
    return loss, {**stats, **ratio_stats(ratio, log_ratio, mask)}


def _dppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    in_region: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO's loss given its trust-region mask:  l_t = -sg[min(r_t, c) * m_t] * A_t * logp_t, with
    c = ``dual_clip`` (verl's clip_ratio_c; unset: 20). ``clip_frac``: tokens outside the region;
    ``truncated_frac``: tokens inside it whose weight hit c."""
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    cap = DPPO_DEFAULT_RATIO_CAP if cfg.dual_clip is None else cfg.dual_clip
    inside = in_region.detach().to(logprobs.dtype)
    loss = weighted_log_likelihood(ratio.clamp(max=cap) * inside, advantages, logprobs, mask)
    stats = {
        "clip_frac": masked_mean(1.0 - inside, mask),
        "truncated_frac": masked_mean((ratio.detach() > cap).to(inside.dtype) * inside, mask),
    }
    return loss, {**stats, **ratio_stats(ratio, log_ratio, mask)}


def dppo_tv_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-TV: the trust region is a bound on the change of the sampled token's
    probability p_t = exp(logp_t) (the total variation of the binary distribution {p, 1 - p}):

        m_t = [p_t - p_old_t <= eps_high]   if A_t > 0   (may not rise further)
              [p_t - p_old_t >= -eps_low]   otherwise    (may not fall further)

    and l_t as in ``_dppo_loss``. ``eps_clip_low`` / ``eps_clip_high`` are these thresholds here."""
    mask = loss_mask.bool()
    change = (logprobs.exp() - old_logprobs.exp()).detach()
    in_region = torch.where(advantages > 0, change <= cfg.eps_clip_high, change >= -cfg.eps_clip_low)
    return _dppo_loss(logprobs, old_logprobs, advantages, mask, in_region, cfg)


def dppo_kl_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-KL: the trust region is a bound on the KL divergence between the binary
    distributions {p_old, 1 - p_old} and {p, 1 - p} of the sampled token,

        D_t = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + e) / (1 - p + e)),  e = 1e-8
        m_t = [D_t <= eps_high or p_t <= p_old_t]   if A_t > 0
              [D_t <= eps_low  or p_t >= p_old_t]   otherwise

    (a move that the advantage pushes back towards p_old is always allowed), and l_t as in
    ``_dppo_loss``."""
    mask = loss_mask.bool()
    logp, old = logprobs.detach(), old_logprobs
    p, p_old = logp.exp(), old.exp()
    divergence = p_old * (old - logp) + (1 - p_old) * torch.log(
        (1 - p_old + BINARY_KL_EPS) / (1 - p + BINARY_KL_EPS)
    )
    up_ok = (divergence <= cfg.eps_clip_high) | (p <= p_old)
    down_ok = (divergence <= cfg.eps_clip_low) | (p >= p_old)
    in_region = torch.where(advantages > 0, up_ok, down_ok)
    return _dppo_loss(logprobs, old_logprobs, advantages, mask, in_region, cfg)
