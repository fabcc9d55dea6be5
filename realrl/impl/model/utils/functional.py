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


def predicting_tokens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """long [T - B]: for entry j of a token-minus-one tensor, the packed token whose logits
    predict token j + 1 of the same sequence (entry j of sequence b sits at token j + b)."""
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    n = int(cu[-1]) - (cu.shape[0] - 1)
    seq = torch.repeat_interleave(
        torch.arange(lens.shape[0], device=cu.device), (lens - 1).clamp(min=0), output_size=n
    )
    return torch.arange(n, device=cu.device) + seq


def masked_shifted_log_probs(
    logits_at: torch.Tensor, cu_seqlens: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``gather_packed_shifted_log_probs`` from the logits of only the tokens that predict the
    entries where ``mask`` [T - B] is set (``logits_at`` [N, V], in packed order): [T - B], 0 where
    the mask is unset. Pair with a forward at ``output_index=predicting_tokens(cu)[mask]``."""
    where = torch.nonzero(mask, as_tuple=True)[0]
    targets = input_ids[predicting_tokens(cu_seqlens)[where] + 1]
    logp = torch.log_softmax(logits_at.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp.new_zeros(mask.shape[0]).index_copy(0, where, logp)
