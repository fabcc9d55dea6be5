"""Seeding of python, numpy and torch ("The N Implementation Details of RLHF with PPO", general detail 6).

Each process gets ``seed + rank * 100003`` so that data-parallel workers sample different
rollouts while the whole run stays reproducible for one seed.
"""

from __future__ import annotations

import random

import numpy as np
import torch

RANK_SEED_STRIDE = 100003


def process_seed(seed: int, rank: int = 0) -> int:
    """The seed of process ``rank`` in a run seeded with ``seed``."""
    if seed < 0 or rank < 0:
        raise ValueError(f"seed and rank must be non-negative, got seed={seed}, rank={rank}")
    return seed + rank * RANK_SEED_STRIDE


def set_random_seed(seed: int, rank: int = 0) -> int:
    """Seed python, numpy and torch (all devices) for this process; return the seed used."""
    local = process_seed(seed, rank)
    random.seed(local)
    np.random.seed(local % (2**32))
    torch.manual_seed(local)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(local)
    return local
