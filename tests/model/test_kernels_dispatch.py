"""The one rule that picks a C kernel or torch code (``kernels.choose_kernel``), what the model
code calls through it, and the native and torch paths agreeing where a C compiler builds the
kernels."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from realrl.impl.model import kernels
from realrl.impl.model.kernels import dispatch, native
from realrl.impl.model.kernels import norm as kernel_norm

GRAIN = dispatch.TORCH_GRAIN_SIZE


def choose(op, device="cpu", dtype=torch.float32, n=100, threads=1, built=True, **kw):
    return kernels.choose_kernel(
        op, device=device, dtype=dtype, n_elements=n, threads=threads, built=built, **kw
    )


@pytest.mark.parametrize("op", sorted(kernels.KERNELS))
def test_only_built_covered_fp32_cpu_calls_go_native(op):
    assert choose(op) == "native"
    assert choose(op, device="cuda") == "torch"
    assert choose(op, device=torch.device("cuda", 0)) == "torch"
    assert choose(op, device=torch.device("cpu")) == "native"
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        assert choose(op, dtype=dtype) == "torch"
    assert choose(op, covered=False) == "torch"
    assert choose(op, built=False) == "torch"


@pytest.mark.parametrize(
    "op, threads, n, expected",
    [
        # spreads its own work over the threads: always the kernel
        ("varlen_attention", 1, 10**8, "native"),
        ("varlen_attention", 2, 10**8, "native"),
        ("varlen_attention", 16, 10, "native"),
        # one thread: only where torch has one too (SDPA spreads any decoding step)
        ("decode_attention", 1, 10**8, "native"),
        ("decode_attention", 2, 1, "torch"),
        # one thread: where torch keeps an elementwise op on one thread (ATen's grain size)
        ("rms_norm", 1, 10 * GRAIN, "native"),
        ("rms_norm", 2, GRAIN, "native"),
        ("rms_norm", 2, GRAIN + 1, "torch"),
        ("rms_norm", 8, 16, "native"),
    ],
)
def test_a_one_thread_kernel_runs_only_where_torch_would_use_one_thread(op, threads, n, expected):
    assert choose(op, threads=threads, n=n) == expected


def test_a_kernel_without_a_backward_never_takes_a_call_that_needs_one():
    assert choose("decode_attention", needs_grad=True) == "torch"
    assert choose("varlen_attention", needs_grad=True) == "native"
    assert choose("rms_norm", needs_grad=True) == "native"


def test_the_rule_is_pure_given_built(monkeypatch):
    def no_loading(name):
        raise AssertionError(f"looked for library {name}")

    monkeypatch.setattr(native, "library", no_loading)
    assert choose("rms_norm", built=True) == "native"
    assert choose("rms_norm", built=False) == "torch"
    # and with built=None it looks only once everything else says native
    assert (
        kernels.choose_kernel("rms_norm", device="cuda", dtype=torch.float32, n_elements=1, threads=1)
        == "torch"
    )
    with pytest.raises(AssertionError, match="rms_norm"):
        kernels.choose_kernel("rms_norm", device="cpu", dtype=torch.float32, n_elements=1, threads=1)
    with pytest.raises(ValueError, match="unknown kernel 'layer_norm'"):
        choose("layer_norm")


def test_use_native_reads_what_the_kernel_covers_off_the_call(monkeypatch):
    monkeypatch.setattr(dispatch, "available", lambda op: True)
    q = torch.randn(5, 4, 16)
    assert kernels.use_native("varlen_attention", q)
    assert not kernels.use_native("varlen_attention", q, window=3)
    assert not kernels.use_native("varlen_attention", q, dropout_p=0.1)
    assert not kernels.use_native("varlen_attention", torch.randn(5, 4, dispatch.MAX_HEAD_DIM + 1))
    assert not kernels.use_native("varlen_attention", q.double())

    class Subclass(torch.Tensor):  # e.g. a collective's not-yet-waited output: no raw pointer
        pass

    assert not kernels.use_native("varlen_attention", q.as_subclass(Subclass))
    w = torch.ones(16)
    assert kernels.use_native("rms_norm", q, weight=w)
    assert not kernels.use_native("rms_norm", q, weight=w.double())
    assert not kernels.use_native("rms_norm", q, weight=torch.ones(8))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            assert kernels.use_native("decode_attention", q.requires_grad_())
        assert not kernels.use_native("decode_attention", q)  # autograd wants a gradient
        torch.set_num_threads(2)
        assert not kernels.use_native("decode_attention", q.detach())
        assert kernels.use_native("varlen_attention", q)
    finally:
        torch.set_num_threads(threads)


def test_torch_only_switches_kernels_off_inside_the_block_only(monkeypatch):
    monkeypatch.setattr(native, "library", lambda name: object())  # as if every library were built
    assert kernels.available("rms_norm") and kernels.available("varlen_attention")
    with kernels.torch_only("rms_norm"):
        assert not kernels.available("rms_norm") and kernels.available("varlen_attention")
        with kernels.torch_only():
            assert not any(kernels.available(op) for op in kernels.KERNELS)
        assert not kernels.available("rms_norm") and kernels.available("varlen_attention")
    assert all(kernels.available(op) for op in kernels.KERNELS)
    with pytest.raises(ValueError, match="unknown kernels"):
        with kernels.torch_only("nope"):
            pass


def rms_norm_and_grads(x, w, g):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = kernels.rms_norm(x, w, 1e-5)
    (y * g).sum().backward()
    return y.detach(), x.grad, w.grad


def test_rms_norm_torch_path_is_the_llama_expression():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 7, 32, generator=gen), torch.randn(32, generator=gen)
    with kernels.torch_only("rms_norm"):
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            y = kernels.rms_norm(x.to(dtype), w.to(dtype), 1e-5)
            h = x.to(dtype).float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
            assert y.dtype == dtype
            assert torch.equal(y, w.to(dtype) * h.to(dtype))


@pytest.mark.skipif(not kernels.available("rms_norm"), reason="no C compiler builds the kernel")
def test_rms_norm_native_and_torch_agree(monkeypatch):
    calls = []
    real = kernel_norm.native_rms_norm
    monkeypatch.setattr(kernel_norm, "native_rms_norm", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(1)
    x, w, g = torch.randn(4, 9, 48, generator=gen), torch.randn(48, generator=gen), torch.randn(4, 9, 48)
    ours = rms_norm_and_grads(x, w, g)
    assert calls == [1]
    with kernels.torch_only("rms_norm"):
        theirs = rms_norm_and_grads(x, w, g)
    assert calls == [1]
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def reference_attention(q, k, v, starts, counts, scale):
    """Query r against keys starts[r] .. starts[r] + counts[r] - 1, one query at a time."""
    group = q.shape[1] // k.shape[1]
    rows = []
    for r in range(q.shape[0]):
        keys = k[starts[r] : starts[r] + counts[r]].repeat_interleave(group, dim=1)
        vals = v[starts[r] : starts[r] + counts[r]].repeat_interleave(group, dim=1)
        p = torch.softmax(torch.einsum("hd,khd->hk", q[r], keys) * scale, dim=-1)
        rows.append(torch.einsum("hk,khd->hd", p, vals))
    return torch.stack(rows)


@pytest.mark.skipif(not kernels.available("varlen_attention"), reason="no C compiler builds the kernel")
def test_varlen_attention_native_agrees_with_torch():
    gen = torch.Generator().manual_seed(2)
    lengths = [5, 1, 11, 7]
    total = sum(lengths)
    starts = torch.repeat_interleave(torch.tensor([0, *lengths[:-1]]).cumsum(0), torch.tensor(lengths))
    counts = torch.cat([torch.arange(1, n + 1) for n in lengths])
    q = torch.randn(total, 4, 16, generator=gen, requires_grad=True)
    k = torch.randn(total, 2, 16, generator=gen, requires_grad=True)
    v = torch.randn(total, 2, 16, generator=gen, requires_grad=True)
    g = torch.randn(total, 4, 16, generator=gen)
    outs = []
    for fn in (kernels.varlen_attention, lambda *a: reference_attention(*a[:5], a[6])):
        out = fn(q, k, v, starts, counts, max(lengths), 0.25)
        outs.append((out.detach(), *torch.autograd.grad((out * g).sum(), (q, k, v))))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not kernels.available("varlen_attention"), reason="no C compiler builds the kernel")
def test_decode_attention_native_agrees_with_torch():
    gen = torch.Generator().manual_seed(3)
    B, hq, hkv, cap, d = 3, 4, 2, 12, 16
    keys, values = torch.randn(2, B, hkv, cap, d, generator=gen)
    lens = torch.tensor([0, 6, 11])  # the new token's slot; it attends to slots 0..lens[b]
    q = torch.randn(B, hq, d, generator=gen)
    out = kernels.decode_attention(q, keys, values, lens, 0.3)
    for b in range(B):
        n = int(lens[b]) + 1
        expected = reference_attention(
            q[b : b + 1], keys[b, :, :n].transpose(0, 1), values[b, :, :n].transpose(0, 1), [0], [n], 0.3
        )
        torch.testing.assert_close(out[b], expected[0], atol=1e-5, rtol=1e-4)


def test_decode_weights_are_prepared_once_per_module_and_held_weakly():
    gen = torch.Generator().manual_seed(4)
    layer, other = nn.Linear(8, 5), nn.Linear(8, 5, bias=False)
    weights = kernels.DecodeWeights()
    builds = []

    def build(module):
        return lambda: builds.append(module) or (module.weight, module.bias)

    x = torch.randn(3, 8, generator=gen)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(
                weights.linear(x, layer, build(layer)), F.linear(x, layer.weight, layer.bias)
            )
            torch.testing.assert_close(weights.linear(x, other, build(other)), F.linear(x, other.weight))
    assert builds == [layer, other] and len(weights) == 2
    del layer, builds[:]
    gc.collect()
    assert len(weights) == 1  # a module that is gone takes its weights with it
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        fresh = kernels.DecodeWeights()
        assert fresh.linear(x.bfloat16(), other, build(other)).dtype == torch.bfloat16
