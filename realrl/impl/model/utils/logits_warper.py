"""Top-k / top-p filtering of next-token logits, with transformers' semantics (ties at the k-th
logit are kept; top-p keeps the smallest set whose mass reaches p, at least one token)."""

from __future__ import annotations

import torch


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Logits [B, V] with everything below the k-th largest per row set to -inf; k <= 0 is a no-op."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: drop the least likely tokens whose total mass is at most 1 - p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cum <= (1 - p)
    drop_sorted[..., -1] = False  # always keep the most likely token
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def warp_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Apply top-k then top-p (the order transformers uses) to temperature-scaled logits."""
    return top_p_filter(top_k_filter(logits, top_k), top_p)
