"""The ``cpu_varlen`` attention kernel equals SDPA (outputs and gradients) on packed batches, with
shared prefixes, output indices, GQA and threads; where no compiler builds it, sdpa takes over."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realrl.impl.model import kernels
from realrl.impl.model.kernels import attention as kernel_attention
from realrl.impl.model.kernels import dispatch, native
from realrl.impl.model.modules.attention import PackedMeta, packed_attention, resolve_attn_impl
from realrl.impl.model.modules.shared_prefix import SharedPrefixes

needs_kernel = pytest.mark.skipif(
    not kernels.available("varlen_attention"), reason="no C compiler builds the kernel"
)


def attention_and_grads(impl, qkv, heads, meta, keep=None, shared=None, seed=0):
    hq, hkv = heads
    q, k, v = qkv.split([hq, hkv, hkv], dim=1)
    out = packed_attention(q, k, v, meta, impl, 0.35, keep=keep, shared=shared)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (grad,) = torch.autograd.grad((out * weights).sum(), qkv)
    return out.detach(), grad


def assert_same(impl_a, impl_b, qkv, *args, **kwargs):
    """``impl_b`` is as close to exact as ``impl_a``: both in fp32 against a float64 reference
    (sdpa), the largest error of ``impl_b`` within 4x that of ``impl_a`` (fp32 sums taken in
    another order round differently; a wrong index or mask is off by O(1))."""
    exact = attention_and_grads("sdpa", qkv.detach().double().requires_grad_(), *args, **kwargs)
    base = attention_and_grads(impl_a, qkv, *args, **kwargs)
    new = attention_and_grads(impl_b, qkv, *args, **kwargs)
    for x, a, b in zip(exact, base, new):
        floor = 1e-6 * (1 + float(x.abs().max()))
        err_a, err_b = float((a.double() - x).abs().max()), float((b.double() - x).abs().max())
        assert err_b <= 4 * max(err_a, floor), (err_b, err_a)


@needs_kernel
@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=7),
    heads=st.sampled_from([(4, 4), (4, 2), (6, 1)]),
    head_dim=st.sampled_from([16, 24, 64]),
    use_keep=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_equals_sdpa_on_packed_sequences(lengths, heads, head_dim, use_keep, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    meta = PackedMeta.from_cu_seqlens(cu, total)
    qkv = torch.randn(total, heads[0] + 2 * heads[1], head_dim, generator=g).requires_grad_()
    keep = torch.nonzero(torch.rand(total, generator=g) < 0.4).flatten() if use_keep else None
    if keep is not None and keep.numel() == 0:
        keep = torch.tensor([total - 1])
    assert_same("sdpa", "cpu_varlen", qkv, heads, meta, keep=keep, seed=seed)


@needs_kernel
@pytest.mark.parametrize("use_keep", [False, True])
def test_equals_sdpa_with_shared_prefixes(use_keep):
    """Compressed tokens: a group's copies of its prompt are one key row, read by every member."""
    g = torch.Generator().manual_seed(5)
    seqs, groups = [], []
    for prompt_len, answers in ((7, (5, 3, 9, 1)), (3, (4,)), (12, (2, 6))):
        prompt = torch.randint(0, 50, (prompt_len,), generator=g)
        seqs += [torch.cat([prompt, torch.randint(50, 99, (n,), generator=g)]) for n in answers]
        groups.append(len(answers))
    ids = torch.cat(seqs)
    cu = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0).to(torch.int32)
    meta = PackedMeta.from_cu_seqlens(cu, len(ids))
    found = SharedPrefixes.find(ids, meta, groups)
    assert found is not None and found.n_compressed < len(ids)
    qkv = torch.randn(found.n_compressed, 4 + 2 * 2, 16, generator=g).requires_grad_()
    keep = torch.arange(2, len(ids), 3) if use_keep else None
    assert_same("sdpa", "cpu_varlen", qkv, (4, 2), meta, keep=keep, shared=(found.expand, found.represent))


@needs_kernel
def test_threads_split_the_work_and_sum_shared_key_gradients(monkeypatch):
    """Over several threads (cut between sequences), results equal one thread's; keys shared by
    sequences on different threads get every thread's gradient."""
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 50, (9,), generator=g)
    seqs = [torch.cat([prompt, torch.randint(50, 99, (n,), generator=g)]) for n in (3, 8, 5, 7, 2, 6)]
    ids = torch.cat(seqs)
    cu = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0).to(torch.int32)
    meta = PackedMeta.from_cu_seqlens(cu, len(ids))
    found = SharedPrefixes.find(ids, meta, [6])
    qkv = torch.randn(found.n_compressed, 12, 16, generator=g).requires_grad_()
    shared = (found.expand, found.represent)
    one_thread = attention_and_grads("cpu_varlen", qkv, (4, 4), meta, shared=shared)
    threads = torch.get_num_threads()
    monkeypatch.setattr(dispatch, "MIN_TRIPLES_PER_THREAD", 1)
    try:
        torch.set_num_threads(3)
        starts, counts = meta.key_ranges
        assert len(kernel_attention._chunks(starts[found.represent], counts[found.represent], 4)) == 3
        split = attention_and_grads("cpu_varlen", qkv, (4, 4), meta, shared=shared)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one_thread, split):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


@needs_kernel
def test_what_the_kernel_does_not_cover_runs_on_sdpa():
    """Sliding windows and fp64 go to sdpa under impl="cpu_varlen", with identical results."""
    lengths = [9, 4, 12]
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    meta = PackedMeta.from_cu_seqlens(cu, sum(lengths))
    q, k, v = torch.randn(3, sum(lengths), 2, 8, dtype=torch.float64)
    assert not kernels.use_native("varlen_attention", q)
    assert not kernels.use_native("varlen_attention", q.float(), window=3)
    for window, x in ((None, (q, k, v)), (3, (q.float(), k.float(), v.float()))):
        a = packed_attention(*x, meta, "sdpa", 0.3, window=window)
        b = packed_attention(*x, meta, "cpu_varlen", 0.3, window=window)
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@needs_kernel
def test_auto_picks_the_kernel_for_fp32_on_cpu_only():
    assert resolve_attn_impl("auto", "cpu", torch.float32) == "cpu_varlen"
    assert resolve_attn_impl("auto", "cpu", torch.bfloat16) == "sdpa"
    with pytest.raises(ValueError, match="CPU kernel"):
        resolve_attn_impl("cpu_varlen", "cuda", torch.float32)


def test_without_a_compiler_auto_falls_back_and_explicit_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang either
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    native.library.cache_clear()
    try:
        assert native.compiler() is None
        assert not kernels.available("varlen_attention")
        assert resolve_attn_impl("auto", "cpu", torch.float32) == "sdpa"
        with pytest.raises(ValueError, match="needs a C compiler"):
            resolve_attn_impl("cpu_varlen", "cpu", torch.float32)
    finally:
        native.library.cache_clear()


def test_disable_switch_and_build_cache(monkeypatch, tmp_path):
    source = native.source("varlen_attention")
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    assert native.load(source) is None
    monkeypatch.delenv(native.DISABLE_ENV)
    if native.compiler() is None:
        pytest.skip("no C compiler")
    assert native.load(source) is not None
    built = [f for f in os.listdir(tmp_path) if f.endswith(".so")]
    assert len(built) == 1, built  # nothing half-written left beside it
    stamp = os.stat(tmp_path / built[0]).st_mtime_ns
    assert native.load(source) is not None
    assert os.stat(tmp_path / built[0]).st_mtime_ns == stamp  # loaded from the cache, not rebuilt


def test_a_broken_source_is_reported_and_loads_nothing(monkeypatch, tmp_path, caplog):
    if native.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    bad = tmp_path / "broken.c"
    bad.write_text("int f( { return 0; }\n")
    realrl_logs = logging.getLogger("realrl")  # its own handler; it does not propagate to caplog's
    realrl_logs.addHandler(caplog.handler)
    try:
        assert native.load(str(bad)) is None
    finally:
        realrl_logs.removeHandler(caplog.handler)
    assert "could not build" in caplog.text and "broken.c" in caplog.text


@needs_kernel
def test_generation_reads_the_kv_cache_in_place_with_the_same_results(tmp_path, monkeypatch):
    """Decoding steps (one query per row against its cache row, rows dropping out at EOS) give
    sdpa's tokens and log-probs; the kernel runs them on one thread (with more, SDPA spreads a
    step's rows over them)."""
    from model_fixtures import make_hf_model, packed

    from realrl.api.core.model_api import GenerationHyperparameters
    from realrl.impl.model.nn.real_model import ReaLModel

    make_hf_model("llama").save_pretrained(tmp_path / "m")  # 4 query / 2 KV heads
    ids, cu = packed([3, 9, 5, 12], seed=4)
    g = GenerationHyperparameters(n=2, max_new_tokens=12, temperature=0.9)
    calls = []
    real = kernels.decode_attention
    monkeypatch.setattr(kernels, "decode_attention", lambda *args: calls.append(1) or real(*args))
    threads = torch.get_num_threads()
    outs = {}
    try:
        torch.set_num_threads(1)
        for impl in ("sdpa", "cpu_varlen"):
            model = ReaLModel.from_pretrained(str(tmp_path / "m"), attn_impl=impl).eval()
            assert model.attn_impl == impl
            torch.manual_seed(0)
            outs[impl] = model.generate(ids, cu, g, eos_token_id=[1, 2, 3])
        assert len(calls) >= 2 * 11  # both layers, every decoding step
        calls.clear()
        torch.set_num_threads(2)
        model.generate(ids, cu, g, eos_token_id=[1, 2, 3])
        assert not calls
    finally:
        torch.set_num_threads(threads)
    a, b = outs["sdpa"], outs["cpu_varlen"]
    assert a.seqlens == b.seqlens and min(a.seqlens) < max(a.seqlens)  # some rows ended early
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-5, rtol=1e-5)
