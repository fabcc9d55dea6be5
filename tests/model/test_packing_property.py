"""Property: a packed forward equals each sequence's forward alone, for any packing."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_fixtures import tiny_real_model


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=8),
    window=st.sampled_from([None, 3]),
    seed=st.integers(0, 1000),
)
def test_packed_equals_each_sequence_alone(lengths, window, seed):
    model = tiny_real_model(window)
    ids = torch.randint(0, 64, (sum(lengths),), generator=torch.Generator().manual_seed(seed))
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    with torch.no_grad():
        packed = model(ids, cu)
        alone = [
            model(ids[a:b], torch.tensor([0, b - a], dtype=torch.int32)) for a, b in zip(cu[:-1], cu[1:])
        ]
    assert (packed - torch.cat(alone)).abs().max().item() < 1e-5
