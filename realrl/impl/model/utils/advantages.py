"""Advantage estimators over packed sequences, registered by name.

Each estimator maps one ``AdvantageInputs`` to ``(advantages, returns)``, both ``[T - N]`` (the
"token minus one" layout of ``ppo_functional``: entry j is about generating token j + 1) and zero
off ``loss_mask``. The math follows the padded ``[B, L]`` formulas of verl's
``verl/trainer/ppo/core_algos.py``, rewritten for packed sequences with segment operations
(``index_add`` / ``repeat_interleave``) instead of padding, and the papers they come from:

  gae                    "High-Dimensional Continuous Control Using Generalized Advantage
                         Estimation" (Schulman et al. 2016), via ``ppo_functional.packed_gae``
  grpo                   "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
                         Language Models" (Shao et al. 2024); ``scale_by_std=False`` is Dr. GRPO,
                         "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al. 2025)
  rloo                   "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
                         Human Feedback in LLMs" (Ahmadian et al. 2024)
  reinforce_pp           "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
  reinforce_pp_baseline  Models" (Hu 2025)
  remax                  "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
                         Aligning Large Language Models" (Li et al. 2023)

verl's other estimators (gdpo, grpo_passk, opo, gpg, the optimal token baselines) are in
``advantages_verl``, on the helpers below.

Conventions shared by the outcome estimators (grpo, rloo, reinforce_pp_baseline): a sequence's
outcome R_i is the sum of its ``token_rewards`` over all its entries, i.e. its score plus its
summed per-token KL reward (verl's ``token_level_rewards.sum(-1)``). A group is the consecutive
``group_sizes[g]`` answers of one prompt. A group of one has no baseline: its answers get
advantage 0 (verl instead uses mean 0 / std 1 for a singleton, which passes the raw outcome on).

The registry (names and needs, built-in entries by reference) is ``rl_registry``, which imports no
torch. Registering a new estimator (plain call; the registry rejects duplicate names)::

    def my_estimator(inp: AdvantageInputs) -> tuple[Tensor, Tensor]: ...
    register_adv_estimator("mine", my_estimator, needs_critic=False)
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from realrl.impl.model.utils import ppo_functional as F
from realrl.impl.model.utils.rl_registry import (  # noqa: F401  (re-exported: the registry's API)
    AdvantageEstimator,
    adv_estimator_names,
    get_adv_estimator,
    register_adv_estimator,
)


@dataclasses.dataclass
class AdvantageInputs:
    """Everything an estimator may read; N sequences packed into T tokens.

    ``token_rewards`` is ``rewards`` of ``ppo_functional.packed_kl_rewards``: -kl_coef * KL on
    each response entry (0 without a KL reward) plus the sequence's score at its last entry.
    """

    token_rewards: Tensor  # [T - N]
    scores: Tensor  # [N] shaped score per sequence (without KL)
    loss_mask: Tensor  # [T - N] bool, True on response tokens
    cu_seqlens: Tensor  # [N + 1] token boundaries
    group_sizes: list[int]  # answers per prompt, consecutive, summing to N
    values: Tensor | None = None  # [T] critic value after each token (GAE only)
    bootstrap: Tensor | None = None  # [N] 1.0 where the last value bootstraps (GAE only)
    baseline_scores: Tensor | None = None  # [N] ReMax: score of the greedy answer to the same prompt
    old_logprobs: Tensor | None = None  # [T - N] log pi_old of each sampled token (optimal token baseline)
    sum_pi_squared: Tensor | None = None  # [T - N] sum over the vocabulary of pi_old^2 (idem; optional)
    reward_components: Tensor | None = None  # [C, N] GDPO: each reward component per sequence
    reward_weights: list[float] | None = None  # [C] GDPO: the components' weights (None: all 1)
    discount: float = 1.0
    gae_lambda: float = 1.0
    scale_by_std: bool = True  # GRPO's std division (False = Dr. GRPO)
    reward_whiten: bool = False  # GAE: whiten token rewards without the mean shift first


# ----------------------------------------------------------------------------- segment helpers


def sequence_ids(short_cu_seqlens: Tensor) -> Tensor:
    """long [T - N]: the index of the sequence each "token minus one" entry belongs to."""
    lens = (short_cu_seqlens[1:] - short_cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens)


def packed_discounted_returns(rewards: Tensor, short_cu_seqlens: Tensor, gamma: float) -> Tensor:
    """G_t = sum_{k >= t} gamma^(k - t) r_k within each sequence (never across sequences).

    The entries are laid into a right-padded [N, max len] grid (padding has r = 0, so it adds
    nothing): gamma = 1 is a reversed cumulative sum along time; otherwise a backward recursion
    G_t = r_t + gamma * G_{t+1}, one step per time position for all sequences at once.
    """
    lens = (short_cu_seqlens[1:] - short_cu_seqlens[:-1]).long()
    n, width = lens.shape[0], int(lens.max()) if lens.numel() else 0
    rows = sequence_ids(short_cu_seqlens)
    cols = torch.arange(rows.shape[0], device=rows.device) - torch.repeat_interleave(
        short_cu_seqlens[:-1].long(), lens
    )
    grid = torch.zeros(n, width, dtype=rewards.dtype, device=rewards.device)
    grid[rows, cols] = rewards
    if gamma == 1.0:
        returns = grid.flip(1).cumsum(1).flip(1)
    else:
        returns = torch.zeros_like(grid)
        running = torch.zeros(n, dtype=rewards.dtype, device=rewards.device)
        for t in reversed(range(width)):
            running = grid[:, t] + gamma * running
            returns[:, t] = running
    return returns[rows, cols]


@dataclasses.dataclass
class Layout:
    """Where each entry and sequence of a packed batch sits (``packed_layout``)."""

    seq_ids: Tensor  # [T - N] sequence of each entry
    group_ids: Tensor  # [N] group of each sequence
    group_counts: Tensor  # [N] size of each sequence's group
    n_groups: int
    mask: Tensor  # [T - N] float
    short_cu: Tensor  # [N + 1]


def packed_layout(inp: AdvantageInputs) -> Layout:
    cu = inp.cu_seqlens.to(inp.token_rewards.device)
    n = cu.shape[0] - 1
    short_cu = F.short_cu_seqlens(cu)
    if inp.token_rewards.shape[0] != int(short_cu[-1]) or inp.loss_mask.shape[0] != int(short_cu[-1]):
        raise ValueError(
            f"token_rewards {tuple(inp.token_rewards.shape)} and loss_mask {tuple(inp.loss_mask.shape)}"
            f" must have T - N = {int(short_cu[-1])} entries for cu_seqlens {cu.tolist()}"
        )
    if sum(inp.group_sizes) != n or any(k < 1 for k in inp.group_sizes):
        raise ValueError(f"group_sizes {inp.group_sizes} must be positive and sum to N = {n}")
    sizes = torch.tensor(inp.group_sizes, dtype=torch.long, device=cu.device)
    group_ids = torch.repeat_interleave(torch.arange(len(inp.group_sizes), device=cu.device), sizes)
    return Layout(
        seq_ids=sequence_ids(short_cu),
        group_ids=group_ids,
        group_counts=sizes[group_ids],
        n_groups=len(inp.group_sizes),
        mask=inp.loss_mask.to(device=cu.device, dtype=torch.float32),
        short_cu=short_cu,
    )


def outcomes(inp: AdvantageInputs, lay: Layout) -> Tensor:
    """R_i = sum of the sequence's token rewards = score + summed KL reward, one per sequence."""
    n = lay.group_ids.shape[0]
    r = inp.token_rewards.float()
    return torch.zeros(n, dtype=r.dtype, device=r.device).index_add(0, lay.seq_ids, r)


def group_sums(x: Tensor, lay: Layout) -> Tensor:
    """[N]: the sum of x over each sequence's group."""
    sums = torch.zeros(lay.n_groups, dtype=x.dtype, device=x.device).index_add(0, lay.group_ids, x)
    return sums[lay.group_ids]


def group_means(x: Tensor, lay: Layout) -> Tensor:
    """[N]: the mean of x over each sequence's group."""
    return group_sums(x, lay) / lay.group_counts.to(x.dtype)


def broadcast(per_seq: Tensor, lay: Layout) -> Tensor:
    """A per-sequence scalar on every response entry of its sequence, 0 elsewhere."""
    return per_seq[lay.seq_ids] * lay.mask


# ----------------------------------------------------------------------------- estimators


def gae_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al.), with PPO's optional reward whitening.

    r_t <- whiten(r_t) without the mean shift (if ``reward_whiten``; "The N Implementation
    Details of RLHF with PPO", per-minibatch reward whitening), then
        delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},   R_t = A_t + V_t
    (``ppo_functional.packed_gae``; the last V_{t+1} is bootstrap * V_last; the tokens off the
    loss mask, such as observations between a trajectory's turns, are skipped). Unlike verl's
    ``compute_gae_advantage_return`` the advantages are not whitened here: the caller's
    advantage normalisation does that.
    """
    if inp.values is None or inp.bootstrap is None:
        raise ValueError("the 'gae' estimator needs values [T] and bootstrap [N] (from a critic)")
    lay = packed_layout(inp)
    rewards = inp.token_rewards.float()
    if inp.reward_whiten:
        rewards = F.whiten(rewards, shift_mean=False, mask=inp.loss_mask.bool())
    values = inp.values.float().to(rewards.device)
    advantages, returns = F.packed_gae(
        rewards,
        values,
        inp.cu_seqlens.to(rewards.device),
        inp.bootstrap.float().to(rewards.device),
        inp.discount,
        inp.gae_lambda,
        mask=inp.loss_mask,  # a multi-turn trajectory's observations are skipped, not steps
    )
    return advantages * lay.mask, returns * lay.mask


def grpo_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GRPO outcome supervision (DeepSeekMath, section 4.1.2; verl's
    ``compute_grpo_outcome_advantage``):

        A_i = (R_i - mean(R_group)) / (std(R_group) + 1e-6)     on every response token of i

    with the unbiased std; ``scale_by_std=False`` drops the division (Dr. GRPO, which shows the
    std division up-weights prompts that are too easy or too hard). Returns = advantages.
    """
    lay = packed_layout(inp)
    per_seq = F.group_normalized_advantages(outcomes(inp, lay), inp.group_sizes, inp.scale_by_std)
    advantages = broadcast(per_seq.to(lay.mask.device), lay)
    return advantages, advantages


def rloo_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, eq. for RLOO; verl's
    ``compute_rloo_outcome_advantage``): the baseline of answer i is the mean of the other
    answers to the same prompt,

        A_i = R_i - 1/(k-1) sum_{j != i} R_j  =  k/(k-1) (R_i - mean(R_group))

    on every response token of i; a group of one gets 0. Returns = advantages.
    """
    lay = packed_layout(inp)
    r = outcomes(inp, lay)
    k = lay.group_counts.to(r.dtype)
    loo = torch.where(k > 1, r - (group_sums(r, lay) - r) / (k - 1).clamp(min=1.0), torch.zeros_like(r))
    advantages = broadcast(loo, lay)
    return advantages, advantages


def reinforce_pp_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025; verl's ``compute_reinforce_plus_plus_outcome_advantage``):

        G_t = sum_{k >= t} gamma^(k - t) r_k   (token rewards: score at the end, -beta KL per token)
        A_t = whiten(G)_t over all response tokens of the batch (global batch normalisation)

    Returns are G. The whitening is ``ppo_functional.whiten`` (biased variance); verl's
    ``masked_whiten`` uses the unbiased one, a factor sqrt(n / (n - 1)) apart.
    """
    lay = packed_layout(inp)
    rewards = inp.token_rewards.float() * lay.mask
    returns = packed_discounted_returns(rewards, lay.short_cu, inp.discount) * lay.mask
    advantages = F.whiten(returns, shift_mean=True, mask=inp.loss_mask.bool())
    return advantages, returns


def reinforce_pp_baseline_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group baseline (Hu 2025; verl's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``):

        A_t = whiten(R_i - mean(R_group))_t   broadcast to i's response tokens, whitened over the batch

    (a group of one has centred outcome 0 before whitening; verl subtracts a mean of 0 there).
    Returns = advantages.
    """
    lay = packed_layout(inp)
    r = outcomes(inp, lay)
    centred = broadcast(r - group_means(r, lay), lay)
    advantages = F.whiten(centred, shift_mean=True, mask=inp.loss_mask.bool())
    return advantages, advantages


def remax_advantages(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023; verl's ``compute_remax_outcome_advantage``): the baseline is the
    reward of the greedy answer to the same prompt,

        G_t = sum_{k >= t} r_k   (gamma = 1),      A_t = G_t - b_i

    Returns are G.
    """
    if inp.baseline_scores is None:
        raise ValueError("the 'remax' estimator needs baseline_scores [N] (a greedy rollout's score)")
    lay = packed_layout(inp)
    rewards = inp.token_rewards.float() * lay.mask
    returns = packed_discounted_returns(rewards, lay.short_cu, 1.0) * lay.mask
    baseline = inp.baseline_scores.float().to(returns.device)
    return returns - broadcast(baseline, lay), returns
