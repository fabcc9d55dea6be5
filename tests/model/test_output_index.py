"""``forward(..., output_index=)`` equals the full forward read at those tokens, with gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_fixtures import tiny_real_model


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    window=st.sampled_from([None, 3]),
    critic=st.booleans(),
    qk_norm=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_output_index_equals_full_forward_at_those_tokens(lengths, window, critic, qk_norm, seed):
    model = tiny_real_model(window, critic, qk_norm)
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
    model = tiny_real_model(None, which == "last", False).train()
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


@settings(max_examples=30, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.integers(1, 8), st.lists(st.integers(1, 6), min_size=1, max_size=4)),
        min_size=1,
        max_size=5,
    ),
    critic=st.booleans(),
    window=st.sampled_from([None, 3]),
    use_index=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_shared_prefix_packing_equals_the_plain_forward(prompts, critic, window, use_index, seed):
    """Groups of sequences with a common prompt (and answers that may start alike), with or
    without output_index: the outputs are those of the plain packed forward."""
    model = tiny_real_model(window, critic, False)
    g = torch.Generator().manual_seed(seed)
    seqs, groups = [], []
    for prompt_len, answer_lens in prompts:
        prompt = torch.randint(0, 64, (prompt_len,), generator=g)
        seqs += [torch.cat([prompt, torch.randint(0, 3, (n,), generator=g)]) for n in answer_lens]
        groups.append(len(answer_lens))
    ids = torch.cat(seqs)
    cu = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0).to(torch.int32)
    keep = torch.nonzero(torch.rand(len(ids), generator=g) < 0.5).squeeze(-1) if use_index else None
    with torch.no_grad():
        plain = model(ids, cu, output_index=keep)
        shared = model(ids, cu, output_index=keep, prefix_groups=groups)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)


def test_shared_prefix_packing_gradients_and_compression():
    from realrl.impl.model.modules.attention import PackedMeta
    from realrl.impl.model.modules.shared_prefix import SharedPrefixes

    model = tiny_real_model(None, False, False).train()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 64, (6,), generator=g)
    seqs = [torch.cat([prompt, torch.randint(0, 64, (n,), generator=g)]) for n in (4, 3, 5)]
    seqs.append(torch.randint(0, 64, (5,), generator=g))  # a group of one: nothing to share
    ids = torch.cat(seqs)
    cu = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0).to(torch.int32)
    found = SharedPrefixes.find(ids, PackedMeta.from_cu_seqlens(cu, len(ids)), [3, 1])
    assert found is not None and found.shared_lens[1] == 0 and found.shared_lens[0] >= 6
    assert found.n_compressed == len(ids) - 2 * found.shared_lens[0]
    torch.testing.assert_close(ids[found.represent][found.expand], ids)

    def grads(**kw) -> list[torch.Tensor]:
        model.zero_grad()
        (model(ids, cu, **kw) ** 2).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    for a, b in zip(grads(), grads(prefix_groups=[3, 1])):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    model.eval()
    with pytest.raises(ValueError, match="group sizes"):
        model(ids, cu, prefix_groups=[2, 1])
