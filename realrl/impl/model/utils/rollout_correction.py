"""The training-inference mismatch, measured and corrected (verl's ``rollout_corr_helper.py``).

"When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch"
(Yao et al. 2025): the answers were sampled by the rollout engine (log-probs ``rollout``), the
loss is computed by the trainer (``train``, the same weights recomputed), and the two disagree.
Per response token t of answer i, with the log ratio l_t = log pi_train(y_t) - log pi_rollout(y_t):

  measured   kl = E_t[-l_t] (k1), k3_kl = E_t[e^l_t - 1 - l_t], log_ratio_abs_mean = E_t[|l_t|], log_ratio_abs_max = max_t |l_t|,
             ppl of each policy per answer exp(-mean_t log p), ppl_ratio = E_i exp(mean_t -l_t),
             chi2_token = E_t[e^{2 l_t}] - 1, chi2_seq = E_i[e^{2 sum_t l_t}] - 1
  weights    token:    w_t = min(e^{l_t}, threshold)
             sequence: w_t = min(e^{sum_{t in i} l_t}, threshold) for every token of answer i
             (log ratios bounded to [-20, 20] before exp; optionally divided by their batch mean)
  rejection  k1_t = -l_t, k2_t = l_t^2 / 2, k3_t = e^{l_t} - 1 - l_t, per token or an answer's sum,
             mean or max; a token (token_*) or a whole answer (seq_*) outside the bounds leaves
             the loss mask

Tensors are packed in the "token minus one" layout of ``ppo_functional`` with
``short_cu_seqlens``; E_t is a mean over the mask's tokens, E_i over all answers. Means divide
by (count + 1e-8) as verl's ``masked_mean`` does, so an answer without response tokens counts with
mean 0. Every output is detached: the weights change the measure, not the objective.
"""

from __future__ import annotations

import torch
from torch import Tensor

from realrl.impl.model.utils.advantages import sequence_ids

SAFETY_BOUND = 20.0  # verl's bound on a log ratio before exp
_EPS = 1e-8  # verl's masked_mean denominator


class _Answers:
    """Per-answer reductions of a packed [T - N] tensor over the mask's tokens."""

    def __init__(self, mask: Tensor, short_cu_seqlens: Tensor):
        self.mask = mask.bool()
        self.m = self.mask.float()
        self.ids = sequence_ids(short_cu_seqlens.to(mask.device))
        self.n = short_cu_seqlens.shape[0] - 1
        self.count = self.sum(torch.ones_like(self.m))

    def sum(self, x: Tensor) -> Tensor:
        x = torch.where(self.mask, x.float(), torch.zeros_like(self.m))
        return torch.zeros(self.n, device=x.device).index_add(0, self.ids, x)

    def mean(self, x: Tensor) -> Tensor:
        return self.sum(x) / (self.count + _EPS)

    def max(self, x: Tensor) -> Tensor:
        """Each answer's largest value on the mask; 0 for an answer without response tokens."""
        filled = torch.where(self.mask, x.float(), torch.full_like(self.m, float("-inf")))
        out = torch.full((self.n,), float("-inf"), device=x.device)
        out = out.scatter_reduce(0, self.ids, filled, reduce="amax")
        return torch.where(torch.isinf(out), torch.zeros_like(out), out)

    def token_mean(self, x: Tensor) -> Tensor:
        return (torch.where(self.mask, x.float(), torch.zeros_like(self.m))).sum() / (self.m.sum() + _EPS)


def offpolicy_metrics(
    train: Tensor, rollout: Tensor, mask: Tensor, short_cu_seqlens: Tensor
) -> dict[str, float]:
    """How far the rollout's log-probs are from the trainer's (verl's ``compute_offpolicy_metrics``
    names, plus ``log_ratio_abs_mean`` and ``log_ratio_abs_max``: the mean and largest |l| over
    the answer tokens, the train/rollout mismatch as the peers report it)."""
    a = _Answers(mask, short_cu_seqlens)
    train, rollout = train.detach().float(), rollout.detach().float()
    log_ratio = train - rollout
    mean_train, mean_rollout = a.mean(train), a.mean(rollout)
    log_ppl_diff = mean_rollout - mean_train
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    seq_log_ratio = a.sum(log_ratio).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    on = a.mask
    stats = {
        "training_ppl": (-mean_train).exp().mean(),
        "training_log_ppl": (-mean_train).mean(),
        "kl": a.token_mean(rollout - train),
        "k3_kl": a.token_mean(log_ratio.exp() - log_ratio - 1),
        "rollout_ppl": (-mean_rollout).exp().mean(),
        "rollout_log_ppl": (-mean_rollout).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": log_ppl_diff.exp().mean(),
        "chi2_token": a.token_mean(rho.square()) - 1.0,
        "chi2_seq": (2.0 * seq_log_ratio).exp().mean() - 1.0,
        "log_ratio_abs_mean": a.token_mean(log_ratio.abs()),
        "log_ratio_abs_max": log_ratio[on].abs().max() if bool(on.any()) else torch.zeros(()),
    }
    return {k: float(v) for k, v in stats.items()}


def importance_weights(
    log_ratio: Tensor,
    mask: Tensor,
    short_cu_seqlens: Tensor,
    level: str,
    threshold: float,
    batch_normalize: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance weights (verl's ``compute_rollout_correction_weights``), 0 off the
    mask, detached; ``level``: token | sequence. Returns (w, ``rollout_is_*`` statistics)."""
    a = _Answers(mask, short_cu_seqlens)
    log_ratio = log_ratio.detach().float()
    if level == "token":
        level_log_ratio = log_ratio
        raw = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    elif level == "sequence":
        level_log_ratio = a.sum(log_ratio)  # one per answer
        raw = level_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()[a.ids]
    else:
        raise ValueError(f"rollout_is={level!r}: choose 'token' or 'sequence'")
    raw = raw * a.m
    w = raw.clamp(max=threshold)
    high, low = (
        level_log_ratio > torch.tensor(threshold).log(),
        level_log_ratio < -torch.tensor(threshold).log(),
    )
    normalised = w.clamp(0.0, threshold) / (a.token_mean(w.clamp(0.0, threshold)) + _EPS)
    stats = {
        "rollout_is_mean": a.token_mean(w),
        "rollout_is_max": w[a.mask].max() if bool(a.mask.any()) else torch.zeros(()),
        "rollout_is_min": w[a.mask].min() if bool(a.mask.any()) else torch.zeros(()),
        "rollout_is_ratio_fraction_high": high.float().mean() if level == "sequence" else a.token_mean(high),
        "rollout_is_ratio_fraction_low": low.float().mean() if level == "sequence" else a.token_mean(low),
        "rollout_is_eff_sample_size": 1.0 / a.token_mean(normalised.square()),
    }
    if batch_normalize:
        if level == "token":
            mean = a.token_mean(w)
        else:
            has_tokens = (a.count > 0).float()
            mean = (a.mean(w) * has_tokens).sum() / has_tokens.sum().clamp(min=_EPS)
        if mean > _EPS:
            w = w / mean
        stats["rollout_is_batch_norm_factor"] = mean if mean > _EPS else torch.ones(())
    return w, {k: float(v) for k, v in stats.items()}


def _divergence(log_ratio: Tensor, estimator: str) -> Tensor:
    """Per token: k1 = -l, k2 = l^2 / 2, k3 = e^l - 1 - l (l bounded to [-20, 20])."""
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    if estimator == "k1":
        return -safe
    if estimator == "k2":
        return 0.5 * safe.square()
    if estimator == "k3":
        return safe.exp() - 1.0 - safe
    raise ValueError(f"unknown divergence estimator {estimator!r}: k1, k2 or k3")


def _statistic(divergence: Tensor, answers: _Answers, level: str) -> Tensor:
    """The filter's statistic per token: the token's own, or its answer's sum / mean / max."""
    if level == "token":
        return divergence
    reduce = {"seq_sum": answers.sum, "seq_mean": answers.mean, "seq_max": answers.max}.get(level)
    if reduce is None:
        raise ValueError(f"unknown rejection level {level!r}: token, seq_sum, seq_mean or seq_max")
    return reduce(divergence)[answers.ids]


def rejection_mask(
    log_ratio: Tensor, mask: Tensor, short_cu_seqlens: Tensor, rules: list
) -> tuple[Tensor, dict[str, float]]:
    """The loss mask without the rejected tokens (verl's ``compute_rollout_rejection_mask``): a
    token stays when every rule (``RejectionRule``: level, estimator, lower, upper) keeps it.
    Returns (bool mask, ``rollout_rs_*`` fractions of response tokens / answers dropped)."""
    a = _Answers(mask, short_cu_seqlens)
    log_ratio = log_ratio.detach().float()
    keep_all = torch.ones_like(a.mask)
    stats: dict[str, float] = {}

    def answer_dropped(keep: Tensor) -> Tensor:
        return a.sum((~keep).float()) > 0

    for rule in rules:
        stat = _statistic(_divergence(log_ratio, rule.estimator), a, rule.level)
        keep = stat <= rule.upper
        if rule.lower is not None:
            keep = keep & (stat >= rule.lower)
        keep_all = keep_all & keep
        stats[f"rollout_rs_{rule.option}_masked_fraction"] = float(a.token_mean(~keep))
        stats[f"rollout_rs_{rule.option}_seq_masked_fraction"] = float(
            answer_dropped(keep)[a.count > 0].float().sum() / (a.count > 0).float().sum().clamp(min=1.0)
        )
    stats["rollout_rs_masked_fraction"] = float(a.token_mean(~keep_all))
    stats["rollout_rs_seq_masked_fraction"] = float(answer_dropped(keep_all).float().mean())
    return keep_all & a.mask, stats


def rollout_correction(
    train: Tensor,
    rollout: Tensor,
    mask: Tensor,
    short_cu_seqlens: Tensor,
    is_level: str | None,
    is_threshold: float,
    is_batch_normalize: bool,
    rules: list,
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """Weights (None when ``is_level`` is None), the loss mask after rejection, and every
    statistic prefixed ``rollout_corr/`` (verl's ``compute_rollout_correction_and_rejection_mask``).
    The weights are computed on the mask before rejection, as verl does."""
    log_ratio = train.detach().float() - rollout.detach().float()
    stats = offpolicy_metrics(train, rollout, mask, short_cu_seqlens)
    weights = None
    if is_level is not None:
        weights, is_stats = importance_weights(
            log_ratio, mask, short_cu_seqlens, is_level, is_threshold, is_batch_normalize
        )
        stats.update(is_stats)
    kept = mask.bool()
    if rules:
        kept, rs_stats = rejection_mask(log_ratio, mask, short_cu_seqlens, rules)
        stats.update(rs_stats)
    return weights, kept, {f"rollout_corr/{k}": v for k, v in stats.items()}
