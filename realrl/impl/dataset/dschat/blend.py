"""Blending several sources by weight into one deterministic order (as in DeepSpeed-Chat: several datasets
feed one training run)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def blend_counts(
    sizes: Sequence[int], weights: Sequence[float] | None, total: int | None = None
) -> list[int]:
    """How many items each source contributes: shares of ``total`` (default: all items) by weight,
    rounded by largest remainder so they sum to ``total``. Without weights, every item once."""
    if any(s <= 0 for s in sizes):
        raise ValueError(f"every blended source needs at least one item, sizes {list(sizes)}")
    if weights is None:
        if total is not None and total != sum(sizes):
            raise ValueError("blend: a total other than the sum of sizes needs weights")
        return list(sizes)
    if len(weights) != len(sizes) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(
            f"blend weights {list(weights)} must be {len(sizes)} non-negative numbers, not all 0"
        )
    total = sum(sizes) if total is None else total
    exact = [total * w / sum(weights) for w in weights]
    counts = [int(np.floor(x)) for x in exact]
    order = sorted(range(len(sizes)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def blend_indices(
    sizes: Sequence[int], weights: Sequence[float] | None, seed: int, total: int | None = None
) -> list[tuple[int, int, int]]:
    """(source, item, repeat) triples in a seeded order. A source asked for more items than it
    has goes through whole seeded permutations of itself (``repeat`` counts the pass), so no item
    repeats before every item of its source has been used."""
    counts = blend_counts(sizes, weights, total)
    rng = np.random.RandomState(seed % 2**32)
    picked: list[tuple[int, int, int]] = []
    for src, (size, count) in enumerate(zip(sizes, counts)):
        for rep in range(-(-count // size)):
            perm = rng.permutation(size)[: count - rep * size]
            picked.extend((src, int(i), rep) for i in sorted(perm))
    order = rng.permutation(len(picked))
    return [picked[i] for i in order]
