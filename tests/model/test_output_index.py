"""``forward(..., output_index=)`` equals the full forward read at those tokens, with gradients."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.nn.real_model import ReaLModel


@functools.cache
def _model(window: int | None, critic: bool, qk_norm: bool) -> ReaLModel:
    torch.manual_seed(0)
    cfg = ReaLModelConfig(
        n_layers=2,
        n_q_heads=4,
        n_kv_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        vocab_size=64,
        sliding_window=window,
        is_critic=critic,
        qk_layernorm=qk_norm,
    )
    return ReaLModel(cfg).eval()


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    window=st.sampled_from([None, 3]),
    critic=st.booleans(),
    qk_norm=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_output_index_equals_full_forward_at_those_tokens(lengths, window, critic, qk_norm, seed):
    model = _model(window, critic, qk_norm)
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    ids = torch.randint(0, 64, (total,), generator=g)
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    keep = torch.nonzero(torch.rand(total, generator=g) < 0.5).squeeze(-1)  # any subset, even empty
    with torch.no_grad():
        full = model(ids, cu)
        part = model(ids, cu, output_index=keep)
    assert part.shape == full[keep].shape
    torch.testing.assert_close(part, full[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("which", ["last", "answer"])
def test_output_index_gradients_equal_the_full_forward(which):
    """The gradient of a loss over some tokens is the same whichever way they are computed."""
    model = _model(None, which == "last", False).train()
    lengths = [5, 9, 3, 7]
    ids = torch.randint(0, 64, (sum(lengths),), generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    if which == "last":
        keep = (cu[1:] - 1).long()
    else:  # every token from the third of each sequence on
        keep = torch.cat([torch.arange(a + 2, b) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])

    def grads(out: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        (out.float() ** 2).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    full_grads = grads(model(ids, cu)[keep])
    part_grads = grads(model(ids, cu, output_index=keep))
    assert len(full_grads) == len(part_grads) > 0
    for a, b in zip(full_grads, part_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    model.eval()
