"""DeepSpeed-Chat's phase split: one corpus cut into disjoint parts by a ratio string like "2,4,4".

The permutation is DeepSpeed-Chat's (``np.random.RandomState(seed).shuffle`` of ``arange``), so a
user moving from it gets the same rows per phase whenever the ratios divide the size evenly. The
result is cached on disk under a hash of every input; the cache is written to a temporary file and
renamed into place, so a crash never leaves a half-written cache file.
"""

from __future__ import annotations

import fractions
import hashlib
import os
import tempfile

import numpy as np

_CACHE_VERSION = 1


def parse_split(data_split: str | list[float] | tuple[float, ...]) -> list[fractions.Fraction]:
    """``"2,4,4"`` -> [1/5, 2/5, 2/5]: non-negative parts, normalised to sum to one."""
    parts = data_split.split(",") if isinstance(data_split, str) else list(data_split)
    try:
        values = [fractions.Fraction(str(p).strip()) for p in parts]
    except (ValueError, ZeroDivisionError) as e:
        raise ValueError(f"data_split {data_split!r} must be comma-separated numbers like '2,4,4'") from e
    if not values or any(v < 0 for v in values) or sum(values) == 0:
        raise ValueError(f"data_split {data_split!r} needs non-negative parts with a positive sum")
    total = sum(values)
    return [v / total for v in values]


def split_bounds(data_size: int, data_split) -> list[int]:
    """Boundaries 0 = b0 <= b1 <= ... <= bk = data_size with b_i = round(size * cumulative ratio_i),
    so every part is within one row of its ratio's share."""
    ratios = parse_split(data_split)
    bounds, cum = [0], fractions.Fraction(0)
    for r in ratios:
        cum += r
        bounds.append(int(round(cum * data_size)))
    bounds[-1] = data_size
    return bounds


def _shuffled(data_size: int, seed: int) -> np.ndarray:
    dtype = np.uint32 if data_size < np.iinfo(np.uint32).max - 1 else np.int64
    idx = np.arange(data_size, dtype=dtype)
    np.random.RandomState(seed=seed).shuffle(idx)
    return idx.astype(np.int64)


def _cache_path(cache_dir: str, data_size: int, data_split, seed: int) -> str:
    norm = ",".join(str(r) for r in parse_split(data_split))
    key = hashlib.sha256(f"v{_CACHE_VERSION}|{data_size}|{norm}|{seed}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir, f"phase_split_{key}.npz")


def _write_atomic(path: str, perm: np.ndarray, bounds: list[int]) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_phase_split_", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, perm=perm, bounds=np.asarray(bounds, dtype=np.int64))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _read_cache(path: str, data_size: int, n_parts: int) -> tuple[np.ndarray, list[int]] | None:
    """The cached split, or None when absent or unreadable or inconsistent (then it is rebuilt)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            perm, bounds = z["perm"], z["bounds"].tolist()
    except (OSError, ValueError, KeyError):
        return None
    if perm.shape != (data_size,) or len(bounds) != n_parts + 1 or bounds[-1] != data_size:
        return None
    return perm, bounds


def all_phase_indices(data_size: int, data_split, seed: int, cache_dir: str | None = None) -> list[list[int]]:
    """Every part's indices (see ``phase_indices``)."""
    if data_size < 0:
        raise ValueError(f"data_size must be >= 0, got {data_size}")
    n_parts = len(parse_split(data_split))
    cached = None
    path = None
    if cache_dir is not None:
        path = _cache_path(cache_dir, data_size, data_split, seed)
        cached = _read_cache(path, data_size, n_parts) if os.path.exists(path) else None
    if cached is None:
        perm, bounds = _shuffled(data_size, seed), split_bounds(data_size, data_split)
        if path is not None:
            _write_atomic(path, perm, bounds)
    else:
        perm, bounds = cached
    return [perm[bounds[i] : bounds[i + 1]].tolist() for i in range(n_parts)]


def phase_indices(
    data_size: int, data_split, phase: int, seed: int, cache_dir: str | None = None
) -> list[int]:
    """Row indices of phase ``phase`` (1-based: 1 = SFT, 2 = reward, 3 = PPO with "2,4,4").

    Deterministic in (data_size, data_split, seed); the phases are pairwise disjoint, their union
    is ``range(data_size)`` and each is within one row of its ratio's share.
    """
    n_parts = len(parse_split(data_split))
    if not 1 <= phase <= n_parts:
        raise ValueError(f"phase {phase} out of range for data_split {data_split!r} ({n_parts} parts)")
    return all_phase_indices(data_size, data_split, seed, cache_dir)[phase - 1]
