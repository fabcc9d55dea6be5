"""verl's further advantage estimators over packed sequences, under verl's names.

Same contract as ``advantages``: ``AdvantageInputs -> (advantages [T - N], returns [T - N])``,
zero off ``loss_mask``; same outcome R_i (the sum of the sequence's token rewards) and same
groups (the consecutive ``group_sizes[g]`` answers of one prompt). The math follows verl's
``verl/trainer/ppo/core_algos.py`` (``compute_*_advantage``) and the papers it cites:

  gdpo                        "GDPO: Group reward-Decoupled Normalization Policy Optimization for
                              Multi-reward RL Optimization" (arXiv 2601.05242)
  grpo_passk                  the Pass@k objective verl cites as arXiv 2503.19595
  opo                         "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585)
  gpg                         "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
                              Reasoning" (arXiv 2504.02546)
  optimal_token_baseline      verl's optimal token baseline (OTB): a per-step baseline weighted
  tir_optimal_token_baseline  by each path's accumulated score-function variance; ``tir_`` counts
                              steps in model tokens only (tool-integrated, multi-turn rollouts)

Shared with ``advantages``: a group of one has no baseline and gets advantage 0 (verl passes the
raw outcome or return on), and batch whitening is ``ppo_functional.whiten`` (biased variance;
verl's ``masked_whiten`` is a factor sqrt(n / (n - 1)) apart). The optimal token baselines read
``old_logprobs`` (and ``sum_pi_squared`` when a caller has it, else its one-sample estimate).
"""

from __future__ import annotations

import torch
from torch import Tensor

from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.advantages import (
    AdvantageInputs,
    Layout,
    broadcast,
    group_means,
    group_sums,
    outcomes,
    packed_discounted_returns,
    packed_layout,
)

GRPO_EPS = 1e-6  # verl's ``epsilon`` of the group std division
OTB_EPS = 1e-8  # verl's ``epsilon`` of the optimal token baseline's division


def _with_baseline(per_seq: Tensor, lay: Layout) -> Tensor:
    """``per_seq`` where the sequence's group has 2+ answers, 0 in a group of one."""
    return torch.where(lay.group_counts > 1, per_seq, torch.zeros_like(per_seq))


def _response_lengths(lay: Layout) -> Tensor:
    """[N]: the response entries (loss-mask ones) of each sequence."""
    n = lay.group_ids.shape[0]
    return torch.zeros(n, dtype=lay.mask.dtype, device=lay.mask.device).index_add(0, lay.seq_ids, lay.mask)


def _segment_cumsum(x: Tensor, lay: Layout) -> Tensor:
    """The running sum of x along each sequence's entries, restarting at each sequence."""
    total = torch.cumsum(x.double(), 0)
    before = torch.cat([total.new_zeros(1), total])[lay.short_cu[:-1].long()]
    return (total - before[lay.seq_ids]).to(x.dtype)


# ----------------------------------------------------------------------------- outcome estimators


def gdpo_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GDPO (verl's ``compute_gdpo_outcome_advantage``): each reward component
    is group-normalised on its own, then the weighted sum is whitened over the batch,

        A_i = whiten( sum_c w_c (r_{c,i} - mean_g(r_c)) / (std_g(r_c) + 1e-6) )   on i's tokens

    so a component with a large spread cannot drown the others (GRPO sums first). Components are
    ``reward_components`` [C, N] (verl's ``gdpo_reward_keys``) with ``reward_weights`` (verl's
    ``gdpo_reward_weights``, default all 1); without components, the outcome R is the only one.
    ``scale_by_std=False`` drops the std division. Returns = advantages.
    """
    lay = packed_layout(inp)
    comps = outcomes(inp, lay)[None] if inp.reward_components is None else inp.reward_components.float()
    weights = [1.0] * comps.shape[0] if inp.reward_weights is None else list(inp.reward_weights)
    if comps.shape[-1] != lay.group_ids.shape[0] or len(weights) != comps.shape[0]:
        raise ValueError(
            f"gdpo: reward_components {tuple(comps.shape)} must be [C, N = {lay.group_ids.shape[0]}]"
            f" with C = len(reward_weights) = {len(weights)}"
        )
    total = sum(
        w * F.group_normalized_advantages(c, inp.group_sizes, inp.scale_by_std, GRPO_EPS)
        for w, c in zip(weights, comps)
    )
    advantages = F.whiten(
        broadcast(total.to(lay.mask.device), lay), shift_mean=True, mask=inp.loss_mask.bool()
    )
    return advantages, advantages


def grpo_passk_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Pass@k (verl's ``compute_grpo_passk_outcome_advantage``): only
    the best answer of each group learns, by its margin over the runner-up,

        A_best = (R_(1) - R_(2)) / (std_g(R) + 1e-6),   every other answer 0

    (R_(1) >= R_(2) the two largest outcomes of the group; ``scale_by_std=False`` drops the
    division). Every group needs 2+ answers. Returns = advantages.
    """
    lay = packed_layout(inp)
    if any(k < 2 for k in inp.group_sizes):
        raise ValueError(f"grpo_passk needs 2+ answers per prompt, got group sizes {inp.group_sizes}")
    r = outcomes(inp, lay)
    per_seq = torch.zeros_like(r)
    start = 0
    for k in inp.group_sizes:
        group = r[start : start + k]
        top, where = torch.topk(group, 2)
        margin = top[0] - top[1]
        if inp.scale_by_std:
            margin = margin / (group.std() + GRPO_EPS)
        per_seq[start + int(where[0])] = margin
        start += k
    advantages = broadcast(per_seq, lay)
    return advantages, advantages


def opo_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """OPO (verl's ``compute_opo_outcome_advantage``): the baseline is the
    group's outcome averaged with weights the response lengths |o_j|,

        A_i = R_i - sum_j |o_j| R_j / sum_j |o_j|        on every response token of i

    (the variance-minimising baseline when the gradient's norm grows with length). Returns =
    advantages.
    """
    lay = packed_layout(inp)
    r = outcomes(inp, lay)
    lengths = _response_lengths(lay).to(r.dtype)
    baseline = group_sums(lengths * r, lay) / group_sums(lengths, lay).clamp(min=1.0)
    advantages = broadcast(_with_baseline(r - baseline, lay), lay)
    return advantages, advantages


def gpg_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GPG (verl's ``compute_gpg_outcome_advantage``): the group mean as the
    baseline, no std division, rescaled by the share of answers with a nonzero outcome,

        A_i = alpha (R_i - mean_g(R)),   alpha = B / max(M, 1)

    B the batch's answers, M those with R != 0 (verl's ``f_norm`` divisor is fixed at 1).
    Returns = advantages.
    """
    lay = packed_layout(inp)
    r = outcomes(inp, lay)
    alpha = r.shape[0] / max(int(torch.count_nonzero(r)), 1)
    advantages = broadcast(_with_baseline(alpha * (r - group_means(r, lay)), lay), lay)
    return advantages, advantages


# ----------------------------------------------------------------------------- optimal token baselines


def _optimal_token_baseline(inp: AdvantageInputs, lay: Layout, steps: Tensor) -> tuple[Tensor, Tensor]:
    """The OTB of verl's ``compute_optimal_token_baseline_advantage``, with the step of each entry
    given (``steps``: its time index t within the response; ignored off the mask):

        G_t = sum_{k >= t} r_k                      (reward to go, gamma = 1)
        w_t = 1 - 2 pi_t + sum_v pi(v)^2            (||grad_logits log pi(a_t)||^2)
        W_t = sum_{j <= t} w_j                      (the path's accumulated variance)
        B_{g,t} = sum_{i in g} G_{i,t} W_{i,t} / (sum_{i in g} W_{i,t} + 1e-8),   A = G - B

    over the group's answers that reach step t. When one answer is strictly the group's longest,
    its baseline is 0 from the runner-up's length on (verl's ``handle_zero_tail``). Without
    ``sum_pi_squared`` the sampled token's pi_t stands in for sum_v pi(v)^2, its one-sample
    estimate (E_{a ~ pi}[pi(a)] = sum_v pi(v)^2), so w_t = 1 - pi_t. Returns are G.
    """
    if inp.old_logprobs is None:
        raise ValueError("the optimal token baseline needs old_logprobs [T - N] (the rollout's log-probs)")
    mask = lay.mask
    returns = packed_discounted_returns(inp.token_rewards.float() * mask, lay.short_cu, 1.0) * mask
    pi = inp.old_logprobs.float().exp()
    sum_sq = pi if inp.sum_pi_squared is None else inp.sum_pi_squared.float()
    path_variance = _segment_cumsum((1.0 - 2.0 * pi + sum_sq) * mask, lay)
    # one cell per (group, step): the baseline shared by the group's answers at that step
    steps = steps.clamp(min=0).long()
    width = int(steps.max()) + 1 if steps.numel() else 1
    cell = lay.group_ids[lay.seq_ids] * width + steps
    cells = returns.new_zeros(lay.n_groups * width)
    numerator = cells.index_add(0, cell, returns * path_variance * mask)
    denominator = cells.index_add(0, cell, path_variance * mask)
    baseline = (numerator / (denominator + OTB_EPS))[cell]
    # zero tail: the strictly longest answer beyond the runner-up's length
    lengths = _response_lengths(lay)
    longest = lengths.new_zeros(lay.n_groups).scatter_reduce(0, lay.group_ids, lengths, "amax")[lay.group_ids]
    at_longest = lengths == longest
    unique = group_sums(at_longest.to(lengths.dtype), lay) == 1
    others = torch.where(at_longest, torch.full_like(lengths, -1.0), lengths)
    runner_up = lengths.new_zeros(lay.n_groups).scatter_reduce(0, lay.group_ids, others, "amax")[
        lay.group_ids
    ]
    tail_seq = at_longest & unique & (lay.group_counts > 1)
    in_tail = tail_seq[lay.seq_ids] & (steps >= runner_up[lay.seq_ids])
    baseline = torch.where(in_tail, torch.zeros_like(baseline), baseline)
    has_group = (lay.group_counts > 1)[lay.seq_ids].to(mask.dtype)
    return (returns - baseline) * mask * has_group, returns


def optimal_token_baseline_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Optimal token baseline (verl's ``compute_optimal_token_baseline_advantage``; formula in
    ``_optimal_token_baseline``): step t is the position from the first response token, so the
    tokens between a trajectory's turns (observations, off the mask) still advance the clock."""
    lay = packed_layout(inp)
    index = torch.arange(lay.seq_ids.shape[0], device=lay.mask.device)
    on = lay.mask.bool()
    first = torch.full((lay.group_ids.shape[0],), index.shape[0], dtype=index.dtype, device=index.device)
    first = first.scatter_reduce(0, lay.seq_ids[on], index[on], "amin")
    return _optimal_token_baseline(inp, lay, index - first[lay.seq_ids])


def tir_optimal_token_baseline_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """The optimal token baseline for tool-integrated, multi-turn rollouts (verl's
    ``compute_multi_turn_optimal_token_baseline_advantage``; formula in ``_optimal_token_baseline``):
    step t counts the model's own tokens only, so answers are aligned by the tokens they wrote."""
    lay = packed_layout(inp)
    return _optimal_token_baseline(inp, lay, _segment_cumsum(lay.mask, lay) - 1.0)
