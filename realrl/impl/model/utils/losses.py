"""Supervised, reward-model and preference losses over packed sequences.

Each function shows its formula; the interfaces in ``realrl.impl.interface`` only gather inputs.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F


def sft_loss(logp: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Next-token negative log-likelihood, mean over the tokens where ``loss_mask`` [T - B] is set:

    L = - sum_j mask_j * log p(x_{j+1} | x_{<=j}) / sum_j mask_j
    ``logp`` [T - B] is log p(x_{j+1} | x_{<=j}) (``packed_logprobs``). The mask selects answer
    tokens (prompt masked) or every token (DeepSpeed-Chat's phase 1: "all tokens").
    Returns (loss, number of counted tokens).
    """
    mask = loss_mask.to(logp.dtype)
    n = int(mask.sum())
    return -(logp * mask).sum() / max(n, 1), n


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    """Pairwise reward-model loss (TRL ``RewardTrainer.compute_loss``, checked against trl 1.16):

    L = mean( -log sigmoid(r_c - r_r - margin) ) + coef * mean( (r_c + r_r)^2 )
    The second term (``center_rewards_coefficient``) keeps rewards centred on 0.
    """
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
    return loss


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Direct preference optimisation on summed answer log-probs (one entry per pair).

    h = (log pi(c) - log pi_ref(c)) - (log pi(r) - log pi_ref(r))
    sigmoid: L = mean( -(1 - ls) * log sigmoid(beta * h) - ls * log sigmoid(-beta * h) )
    ipo:     L = mean( (h' - 1 / (2 beta))^2 ),  h' using per-token averages of each log ratio
             (TRL's IPO, which divides each side by its number of answer tokens)
    Stats: implicit rewards beta * (log pi - log pi_ref) and the pairwise accuracy.
    """
    chosen_logratio = policy_chosen - ref_chosen
    rejected_logratio = policy_rejected - ref_rejected
    if loss_type == "sigmoid":
        h = chosen_logratio - rejected_logratio
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("dpo_loss(loss_type='ipo') needs chosen_lengths and rejected_lengths")
        h = chosen_logratio / chosen_lengths.clamp(min=1) - rejected_logratio / rejected_lengths.clamp(min=1)
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose 'sigmoid' or 'ipo'")
    chosen_reward = (beta * chosen_logratio).detach()
    rejected_reward = (beta * rejected_logratio).detach()
    stats = {
        "chosen_reward": chosen_reward.mean(),
        "rejected_reward": rejected_reward.mean(),
        "accuracy": (chosen_reward > rejected_reward).float().mean(),
    }
    return losses.mean(), stats
