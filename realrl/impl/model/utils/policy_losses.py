"""Policy-gradient losses per token, registered by name, and how to average them.

A policy loss is ``fn(logprobs, old_logprobs, advantages, loss_mask, short_cu_seqlens, cfg)
-> (per_token_loss [T - N], stats)``; every tensor is in the "token minus one" layout of
``ppo_functional`` (``short_cu_seqlens = ppo_functional.short_cu_seqlens(cu_seqlens)``), the
per-token loss is 0 off ``loss_mask`` and ``stats`` holds at least ``clip_frac``,
``importance_ratio`` and ``approx_kl`` (masked means over response tokens, as
the clipped surrogate always reported). ``aggregate_loss`` then reduces the per-token loss to
a scalar in one of ``AGGREGATIONS``.

  ppo   (also ``vanilla``, verl's name)
        "Proximal Policy Optimization Algorithms" (Schulman et al. 2017), with the asymmetric
        "clip-higher" range of "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
        (Yu et al. 2025) and the dual clip of "Mastering Complex Control in MOBA Games with Deep
        Reinforcement Learning" (Ye et al. 2020); verl's ``compute_policy_loss``.
  gspo  "Group Sequence Policy Optimization" (Zheng et al. 2025); verl's
        ``compute_policy_loss_gspo``.

The other losses verl registers: ``policy_losses_pg`` (cispo, gpg, dro, dppo_tv, dppo_kl: a
weighted log-likelihood, -w * A * logp) and ``policy_losses_shaped`` (geo_mean, sapo, clip_cov,
kl_cov: PPO's surrogate reshaped); their shared pieces (``token_ratio``, ``ratio_stats``) are here.

The registry (names; built-in entries by reference) and ``PolicyLossConfig`` are in
``rl_registry``, which imports no torch. Registering a new loss (plain call; the registry rejects
duplicate names)::

    register_policy_loss("mine", my_loss)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from realrl.impl.model.utils.advantages import sequence_ids
from realrl.impl.model.utils.ppo_functional import masked_mean
from realrl.impl.model.utils.rl_registry import (  # noqa: F401  (re-exported: the registry's API)
    AGGREGATIONS,
    PolicyLossConfig,
    get_policy_loss,
    policy_loss_names,
    register_policy_loss,
)

# verl's bounds on the log importance ratio before ``exp`` (no overflow to inf, no NaN gradients)
PPO_LOG_RATIO_BOUND = 20.0
GSPO_LOG_RATIO_MAX = 10.0


PolicyLossFn = Callable[
    [Tensor, Tensor, Tensor, Tensor, Tensor, PolicyLossConfig], tuple[Tensor, dict[str, Tensor]]
]


# ----------------------------------------------------------------------------- losses


def token_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(log r_t, r_t) with log r_t = logp_t - logp_old_t on the mask (0 off it), and
    r_t = exp(log r_t) with the log bounded to +-20 as verl does before ``exp``."""
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    return log_ratio, torch.exp(log_ratio.clamp(-PPO_LOG_RATIO_BOUND, PPO_LOG_RATIO_BOUND))


def ratio_stats(ratio: Tensor, log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The masked means every loss reports: ``importance_ratio`` (of r) and ``approx_kl``
    (of -log r, verl's ``ppo_kl``); the early stops read them."""
    return {
        "importance_ratio": masked_mean(ratio.detach(), mask),
        "approx_kl": masked_mean(-log_ratio.detach(), mask),
    }


def clipped_surrogate(
    ratio: Tensor, log_ratio: Tensor, advantages: Tensor, mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped surrogate per token, shared by ``ppo`` (token ratios) and ``gspo``
    (sequence ratios):

        L = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))
        dual clip, for A < 0 only:  L = min(L, -A * c)

    Returns (per-token loss, 0 off the mask; ``clip_frac``, ``dual_clip_frac``, and the
    masked means ``importance_ratio`` of ``ratio`` and ``approx_kl`` of the token ``log_ratio``).
    """
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * ratio.clamp(1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high)
    loss = torch.max(pg_loss1, pg_loss2)
    dual_frac = torch.zeros((), device=ratio.device)
    if cfg.dual_clip is not None:
        pg_loss3 = -advantages * cfg.dual_clip
        negative = advantages < 0
        dual_frac = masked_mean(((loss > pg_loss3) & negative).float().detach(), mask)
        loss = torch.where(negative, torch.min(loss, pg_loss3), loss)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    stats = {
        "clip_frac": masked_mean((pg_loss2 > pg_loss1).float().detach(), mask),
        "dual_clip_frac": dual_frac,
        **ratio_stats(ratio, log_ratio, mask),
    }
    return loss, stats


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level PPO: r_t = exp(logp_t - logp_old_t), clipped as in ``clipped_surrogate``.

    With eps_clip_low == eps_clip_high and no dual clip, the per-token terms are those of
    the classic clipped surrogate (as long as |logp - logp_old| <= 20, where verl bounds the log
    ratio). ``short_cu_seqlens`` is unused.
    """
    mask = loss_mask.bool()
    log_ratio, ratio = token_ratio(logprobs, old_logprobs, mask)
    return clipped_surrogate(ratio, log_ratio, advantages, mask, cfg)


def gspo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    cfg: PolicyLossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: one importance ratio per sequence, the length-normalised sequence likelihood ratio

        s_i = exp( 1/|y_i| * sum_t (logp_t - logp_old_t) )            (over i's response tokens)

    in its token form (GSPO-token) s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t]), whose value is
    s_i and whose gradient on logp_t is s_i: with ``seq-mean-token-mean`` aggregation and one
    advantage per sequence this is the gradient of the sequence-level objective. Then
    L_t = max(-A_t s_{i,t}, -A_t clip(s_{i,t}, 1 - eps_low, 1 + eps_high)) (and the dual clip
    when configured, which GSPO itself does not use). Since s_i is a geometric mean over the whole
    sequence, GSPO's clip range is tiny: the paper uses eps_low = 3e-4, eps_high = 4e-4. verl
    bounds log s_{i,t} above by 10.
    """
    mask = loss_mask.bool()
    m = mask.to(logprobs.dtype)
    seq_ids = sequence_ids(short_cu_seqlens.to(logprobs.device))
    n_seqs = short_cu_seqlens.shape[0] - 1
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    zeros = torch.zeros(n_seqs, dtype=logprobs.dtype, device=logprobs.device)
    n_tok = zeros.index_add(0, seq_ids, m)
    seq_log_ratio = zeros.index_add(0, seq_ids, log_ratio.detach() * m) / n_tok.clamp(min=1.0)
    grad_path = torch.where(mask, logprobs - logprobs.detach(), torch.zeros_like(logprobs))
    log_s = (seq_log_ratio[seq_ids] + grad_path).clamp(max=GSPO_LOG_RATIO_MAX)
    ratio = torch.exp(log_s)
    return clipped_surrogate(ratio, log_ratio, advantages, mask, cfg)


def behaviour_weights(
    prox_logprobs: Tensor, behav_logprobs: Tensor, loss_mask: Tensor, cap: float | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The decoupled PPO objective's per-token weight ("AReaL: A Large-Scale Asynchronous
    Reinforcement Learning System for Language Reasoning", Fu et al. 2025): samples drawn by a
    behaviour policy older than the proximal one (the policy the update starts from) are
    reweighted by w_t = pi_prox(a_t) / pi_behav(a_t), and the clipped surrogate is taken against
    pi_prox. A token whose weight exceeds ``cap`` drops out (weight 0), as AReaL's
    ``behav_imp_weight_cap`` does. Where pi_prox = pi_behav, w = 1: the standard objective.

    Returns (w, 0 off the mask; ``behav_imp_weight``: its masked mean, ``behav_capped_frac``)."""
    mask = loss_mask.bool()
    log_w = torch.where(mask, prox_logprobs - behav_logprobs, torch.zeros_like(prox_logprobs))
    w = torch.exp(log_w.clamp(-PPO_LOG_RATIO_BOUND, PPO_LOG_RATIO_BOUND)).detach()
    capped = torch.zeros_like(mask) if cap is None else (w > cap) & mask
    w = torch.where(mask & ~capped, w, torch.zeros_like(w))
    stats = {
        "behav_imp_weight": masked_mean(w, mask & ~capped),
        "behav_capped_frac": masked_mean(capped.float(), mask),
    }
    return w, stats


# ----------------------------------------------------------------------------- aggregation


def _check_mode(mode: str, norm_const: float | None) -> None:
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
    if mode == "seq-mean-token-sum-norm" and (norm_const is None or not norm_const > 0):
        raise ValueError(
            "'seq-mean-token-sum-norm' needs norm_const > 0 (the generation length limit), "
            f"got {norm_const!r}"
        )


def _per_sequence(per_token_loss: Tensor, loss_mask: Tensor, short_cu_seqlens: Tensor):
    """(masked loss sum, response-token count) per sequence, both [N]."""
    mask = loss_mask.bool()
    x = torch.where(mask, per_token_loss, torch.zeros_like(per_token_loss))
    seq_ids = sequence_ids(short_cu_seqlens.to(x.device))
    zeros = torch.zeros(short_cu_seqlens.shape[0] - 1, dtype=x.dtype, device=x.device)
    return zeros.index_add(0, seq_ids, x), zeros.index_add(0, seq_ids, mask.to(x.dtype))


def aggregate_loss(
    per_token_loss: Tensor,
    loss_mask: Tensor,
    short_cu_seqlens: Tensor,
    mode: str,
    norm_const: float | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar (verl's ``agg_loss`` modes):

      token-mean               sum_{i,t} l_{i,t} / #response tokens (every token weighs the same)
      seq-mean-token-sum       mean_i sum_t l_{i,t}
      seq-mean-token-mean      mean_i (sum_t l_{i,t} / |y_i|)    (every sequence weighs the same; GRPO)
      seq-mean-token-sum-norm  mean_i (sum_t l_{i,t} / norm_const)   (Dr. GRPO: a constant, the
                               generation length limit, instead of |y_i|; required here)

    The sequence means run over the sequences with at least one response token; sequences
    without any count 0. An empty batch (no response token) gives 0. ``norm_const`` is ignored
    by the other modes.
    """
    _check_mode(mode, norm_const)
    sums, counts = _per_sequence(per_token_loss, loss_mask, short_cu_seqlens)
    if mode == "token-mean":
        return sums.sum() / counts.sum().clamp(min=1.0)
    has_tokens = counts > 0
    if mode == "seq-mean-token-sum":
        per_seq = sums
    elif mode == "seq-mean-token-mean":
        per_seq = sums / counts.clamp(min=1.0)
    else:
        per_seq = sums / float(norm_const)
    per_seq = torch.where(has_tokens, per_seq, torch.zeros_like(per_seq))
    return per_seq.sum() / has_tokens.sum().clamp(min=1).to(per_seq.dtype)


def aggregation_weight(loss_mask: Tensor, short_cu_seqlens: Tensor, mode: str) -> float:
    """The weight of a micro-batch's ``aggregate_loss`` when micro-batch losses are combined:
    the number of response tokens for ``token-mean``, the number of sequences with at least one
    response token for the sequence means. Then for every mode

        aggregate(whole batch) = sum_k w_k * aggregate(micro-batch k) / sum_k w_k
    """
    _check_mode(mode, 1.0)
    mask = loss_mask.bool()
    if mode == "token-mean":
        return float(mask.sum())
    seq_ids = sequence_ids(short_cu_seqlens.to(mask.device))
    counts = torch.zeros(short_cu_seqlens.shape[0] - 1, dtype=torch.long, device=mask.device)
    counts = counts.index_add(0, seq_ids, mask.long())
    return float((counts > 0).sum())
