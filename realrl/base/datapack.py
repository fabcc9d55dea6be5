"""Balanced partitions of token counts.

``partition_balanced`` cuts a sequence into contiguous pieces whose largest sum is as small
as possible (micro-batches and data-parallel shards keep sample order).
``ffd_allocate`` packs items into bins under a token budget (first-fit decreasing).
"""

from __future__ import annotations

from collections.abc import Sequence


def _pieces_needed(nums: Sequence[int], cap: int) -> int:
    """Greedy count of contiguous pieces with sums <= cap (cap >= max(nums))."""
    pieces, acc = 1, 0
    for x in nums:
        if acc + x > cap:
            pieces, acc = pieces + 1, x
        else:
            acc += x
    return pieces


def partition_balanced(nums: Sequence[int], k: int) -> list[tuple[int, int]]:
    """Split ``nums`` into exactly ``k`` non-empty contiguous pieces minimising the largest sum.

    Returns ``[(start, end), ...]`` half-open index ranges covering ``nums`` in order.
    """
    n = len(nums)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} items into {k} non-empty pieces")
    if any(x < 0 for x in nums):
        raise ValueError("partition_balanced needs non-negative sizes")
    lo, hi = max(nums), sum(nums)
    while lo < hi:  # smallest cap that needs at most k pieces
        mid = (lo + hi) // 2
        if _pieces_needed(nums, mid) <= k:
            hi = mid
        else:
            lo = mid + 1
    cap = lo
    # Greedy with the optimal cap, then make sure exactly k pieces exist by cutting late
    # pieces while items remain (cutting never raises the maximum).
    bounds: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, x in enumerate(nums):
        remaining_items = n - i
        remaining_pieces = k - len(bounds) - 1
        if i > start and (acc + x > cap or remaining_items == remaining_pieces):
            bounds.append((start, i))
            start, acc = i, 0
        acc += x
    bounds.append((start, n))
    assert len(bounds) == k, (bounds, k)
    return bounds


def partition_under_budget(
    nums: Sequence[int], min_pieces: int = 1, max_per_piece: int | None = None
) -> list[tuple[int, int]]:
    """Fewest contiguous balanced pieces (at least ``min_pieces``) with sums <= ``max_per_piece``.

    A single item larger than the budget gets a piece of its own. ``min_pieces`` is capped by
    the number of items because pieces are never empty.
    """
    n = len(nums)
    if n == 0:
        raise ValueError("cannot partition an empty sequence")
    k = max(1, min(min_pieces, n))
    if max_per_piece is None:
        return partition_balanced(nums, k)
    if max_per_piece <= 0:
        raise ValueError(f"max_per_piece must be positive, got {max_per_piece}")
    k = max(k, min(n, -(-sum(nums) // max_per_piece)))
    while True:
        bounds = partition_balanced(nums, k)
        if all(e - s == 1 or sum(nums[s:e]) <= max_per_piece for s, e in bounds):
            return bounds
        k += 1


def ffd_allocate(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Pack item indices into bins of ``capacity`` tokens, first-fit decreasing.

    Raises ``ValueError`` naming the item if one alone exceeds the capacity.
    """
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    for i, s in enumerate(sizes):
        if s > capacity:
            raise ValueError(f"item {i} has {s} tokens, more than the capacity {capacity}")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + sizes[i] <= capacity:
                bins[b].append(i)
                loads[b] += sizes[i]
                break
        else:
            bins.append([i])
            loads.append(sizes[i])
    return bins
