"""Deterministic data-parallel sharding: every rank computes the same permutation from the seed."""

from __future__ import annotations

import numpy as np


def shard_indices(n: int, dp_rank: int, world_size: int, seed: int) -> list[int]:
    """Row indices this rank owns, ascending: a seeded permutation dealt out round-robin, so the
    shards are disjoint, cover ``range(n)`` and differ in size by at most one."""
    if world_size < 1 or not 0 <= dp_rank < world_size:
        raise ValueError(f"dp_rank {dp_rank} out of range for world_size {world_size}")
    perm = np.random.RandomState(seed % 2**32).permutation(n)
    return sorted(int(i) for i in perm[dp_rank::world_size])
