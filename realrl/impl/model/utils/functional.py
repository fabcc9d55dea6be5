"""Functional building blocks over packed sequences."""

from __future__ import annotations

import torch


def shifted_token_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """bool [T]: False at the last token of each sequence (it predicts nothing inside it)."""
    total = int(cu_seqlens[-1])
    keep = torch.ones(total, dtype=torch.bool, device=cu_seqlens.device)
    keep[cu_seqlens[1:].long() - 1] = False
    return keep


def gather_packed_shifted_log_probs(
    logits: torch.Tensor, cu_seqlens: torch.Tensor, input_ids: torch.Tensor
) -> torch.Tensor:
    """log pi(token j+1 | tokens <= j) for every sequence, packed: [T - B] (``packed_logprobs``).

    ``logits`` is [T, V] (already divided by the temperature when sampling used one).
    """
    logits = logits.float()
    next_ids = torch.roll(input_ids, shifts=-1)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, next_ids.unsqueeze(-1)).squeeze(-1)
    return logp[shifted_token_mask(cu_seqlens)]
