"""Balanced partitions of token counts.

``partition_balanced`` cuts a sequence into contiguous pieces whose largest sum is as small
as possible (micro-batches and data-parallel shards keep sample order).
``ffd_allocate`` packs items into bins under a token budget (first-fit decreasing).
"""

from __future__ import annotations

from collections.abc import Sequence


def _greedy_bounds(nums: Sequence[int], cap: int, k: int | None = None) -> list[tuple[int, int]]:
    """Left-to-right pieces with sums <= ``cap``; an item larger than ``cap`` stands alone.

    With ``k``, extra cuts are made late (when the remaining items are exactly enough to give one
    to every missing piece) so that exactly ``k`` pieces come out; cutting never raises a sum.
    """
    n = len(nums)
    bounds: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, x in enumerate(nums):
        forced = k is not None and n - i == k - len(bounds) - 1
        if i > start and (acc + x > cap or forced):
            bounds.append((start, i))
            start, acc = i, 0
        acc += x
    bounds.append((start, n))
    return bounds


def _smallest_cap(nums: Sequence[int], k: int, hi: int) -> int:
    """Smallest cap in [0, hi] whose greedy partition needs at most ``k`` pieces."""
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_greedy_bounds(nums, mid)) <= k:
            hi = mid
        else:
            lo = mid + 1
    return lo


def partition_balanced(nums: Sequence[int], k: int) -> list[tuple[int, int]]:
    """Split ``nums`` into exactly ``k`` non-empty contiguous pieces minimising the largest sum.

    Returns ``[(start, end), ...]`` half-open index ranges covering ``nums`` in order.
    """
    n = len(nums)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} items into {k} non-empty pieces")
    if any(x < 0 for x in nums):
        raise ValueError("partition_balanced needs non-negative sizes")
    return _greedy_bounds(nums, _smallest_cap(nums, k, sum(nums)), k)


def partition_under_budget(
    nums: Sequence[int], min_pieces: int = 1, max_per_piece: int | None = None
) -> list[tuple[int, int]]:
    """Fewest contiguous pieces (at least ``min_pieces``) with sums <= ``max_per_piece``,
    balanced by their largest sum.

    A single item larger than the budget gets a piece of its own. ``min_pieces`` is capped by
    the number of items because pieces are never empty.
    """
    n = len(nums)
    if n == 0:
        raise ValueError("cannot partition an empty sequence")
    if any(x < 0 for x in nums):
        raise ValueError("partition_under_budget needs non-negative sizes")
    k = max(1, min(min_pieces, n))
    if max_per_piece is None:
        return partition_balanced(nums, k)
    if max_per_piece <= 0:
        raise ValueError(f"max_per_piece must be positive, got {max_per_piece}")
    # Greedy under the budget gives the fewest valid pieces; then balance with a smaller cap.
    k = max(k, len(_greedy_bounds(nums, max_per_piece)))
    return _greedy_bounds(nums, _smallest_cap(nums, k, max_per_piece), k)


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
