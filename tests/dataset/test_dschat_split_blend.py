"""phase_indices (the "2,4,4" split, cached atomically) and blending by weight."""

import fractions
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realrl.impl.dataset.dschat import blend_counts, blend_indices, parse_split, phase_indices
from realrl.impl.dataset.dschat import split as split_mod

ratios = st.lists(st.integers(0, 10), min_size=1, max_size=4).filter(lambda r: sum(r) > 0)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 300), parts=ratios, seed=st.integers(0, 2**31))
def test_phases_are_disjoint_cover_everything_and_follow_the_ratios(n, parts, seed):
    data_split = ",".join(map(str, parts))
    phases = [phase_indices(n, data_split, p, seed) for p in range(1, len(parts) + 1)]
    flat = [i for ph in phases for i in ph]
    assert sorted(flat) == list(range(n))  # pairwise disjoint and covering
    for ph, part in zip(phases, parts):
        assert abs(len(ph) - fractions.Fraction(part, sum(parts)) * n) <= 1
    assert phases == [phase_indices(n, data_split, p, seed) for p in range(1, len(parts) + 1)]


def _deepspeed_chat_reference(n, data_split, seed):
    """DeepSpeed-Chat's get_raw_dataset_split_index, as documented in its data_utils.py."""
    splits = [float(s) for s in data_split.split(",")]
    splits = [s / sum(splits) for s in splits]
    idx = [0]
    for i, s in enumerate(splits):
        idx.append(idx[i] + int(round(s * float(n))))
    diff = idx[-1] - n
    for i in range(1, len(idx)):
        idx[i] -= diff
    perm = np.arange(n, dtype=np.uint32)
    np.random.RandomState(seed=seed).shuffle(perm)
    return [perm[idx[i] : idx[i + 1]].tolist() for i in range(len(splits))]


@pytest.mark.parametrize("n,seed", [(10, 1234), (100, 42), (1000, 0), (250, 7)])
def test_same_rows_per_phase_as_deepspeed_chat(n, seed):
    ref = _deepspeed_chat_reference(n, "2,4,4", seed)
    assert [phase_indices(n, "2,4,4", p, seed) for p in (1, 2, 3)] == ref


def test_cache_is_keyed_by_every_input_and_reused(tmp_path):
    d = str(tmp_path)
    first = phase_indices(50, "2,4,4", 2, seed=1, cache_dir=d)
    files = os.listdir(d)
    assert len(files) == 1 and files[0].startswith("phase_split_")
    mtime = os.stat(tmp_path / files[0]).st_mtime_ns
    assert phase_indices(50, "2,4,4", 2, seed=1, cache_dir=d) == first
    assert os.stat(tmp_path / files[0]).st_mtime_ns == mtime  # read, not rewritten
    # a changed input never reuses the stale file
    for n, split, seed in [(51, "2,4,4", 1), (50, "1,1,1", 1), (50, "2,4,4", 2)]:
        assert phase_indices(n, split, 2, seed=seed, cache_dir=d) == phase_indices(n, split, 2, seed=seed)
    assert len(os.listdir(d)) == 4
    # equal ratios written differently share one key
    phase_indices(50, "1,2,2", 1, seed=1, cache_dir=d)
    assert len(os.listdir(d)) == 4


def test_corrupt_cache_is_rebuilt(tmp_path):
    d = str(tmp_path)
    want = phase_indices(40, "2,4,4", 3, seed=5, cache_dir=d)
    (path,) = [tmp_path / f for f in os.listdir(d)]
    path.write_bytes(b"garbage")
    assert phase_indices(40, "2,4,4", 3, seed=5, cache_dir=d) == want
    np.savez(path, perm=np.arange(7), bounds=np.array([0, 7]))  # readable but inconsistent
    assert phase_indices(40, "2,4,4", 3, seed=5, cache_dir=d) == want


def test_failed_write_leaves_no_half_written_file(tmp_path, monkeypatch):
    def crash(f, **arrays):
        f.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(split_mod.np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        phase_indices(30, "2,4,4", 1, seed=0, cache_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_bad_split_and_phase():
    with pytest.raises(ValueError, match="comma-separated numbers"):
        parse_split("2,x,4")
    with pytest.raises(ValueError, match="positive sum"):
        parse_split("0,0")
    with pytest.raises(ValueError, match="phase 4 out of range"):
        phase_indices(10, "2,4,4", 4, seed=0)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    data=st.data(),
    total=st.integers(1, 200),
    seed=st.integers(0, 1000),
)
def test_blend_follows_weights(sizes, data, total, seed):
    weights = data.draw(st.lists(st.integers(0, 5), min_size=len(sizes), max_size=len(sizes)).filter(any))
    counts = blend_counts(sizes, weights, total)
    assert sum(counts) == total
    for c, w in zip(counts, weights):
        assert abs(c - total * w / sum(weights)) < 1
    picked = blend_indices(sizes, weights, seed, total)
    assert picked == blend_indices(sizes, weights, seed, total)
    assert len(set(picked)) == len(picked) == total
    for src, size in enumerate(sizes):
        items = [(i, rep) for s, i, rep in picked if s == src]
        assert len(items) == counts[src]
        for rep in {r for _, r in items}:  # every pass but the last uses each item exactly once
            this_pass = sorted(i for i, r in items if r == rep)
            assert len(set(this_pass)) == len(this_pass)
            if (rep + 1) * size <= counts[src]:
                assert this_pass == list(range(size))


def test_blend_without_weights_uses_every_item_once():
    picked = blend_indices([3, 2], None, seed=0)
    assert sorted(picked) == [(0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 1, 0)]
    with pytest.raises(ValueError, match="weights"):
        blend_counts([3, 2], [1.0], None)
