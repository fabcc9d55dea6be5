"""Property: a packed forward equals each sequence's forward alone, for any packing."""

from __future__ import annotations

import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.nn.real_model import ReaLModel


@functools.cache
def _model(window: int | None) -> ReaLModel:
    torch.manual_seed(0)
    cfg = ReaLModelConfig(
        n_layers=2,
        n_q_heads=4,
        n_kv_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        vocab_size=64,
        sliding_window=window,
    )
    return ReaLModel(cfg).eval()


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=8),
    window=st.sampled_from([None, 3]),
    seed=st.integers(0, 1000),
)
def test_packed_equals_each_sequence_alone(lengths, window, seed):
    model = _model(window)
    ids = torch.randint(0, 64, (sum(lengths),), generator=torch.Generator().manual_seed(seed))
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    with torch.no_grad():
        packed = model(ids, cu)
        alone = [
            model(ids[a:b], torch.tensor([0, b - a], dtype=torch.int32)) for a, b in zip(cu[:-1], cu[1:])
        ]
    assert (packed - torch.cat(alone)).abs().max().item() < 1e-5
