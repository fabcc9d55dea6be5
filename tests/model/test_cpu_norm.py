"""The C RMSNorm equals the torch expression (outputs, input and weight gradients) and is what the
model's RMSNorm runs on fp32 CPU tensors; other dtypes keep the torch expression."""

from __future__ import annotations

import pytest
import torch

from realrl.impl.model import kernels
from realrl.impl.model.kernels import dispatch
from realrl.impl.model.kernels import norm as kernel_norm
from realrl.impl.model.modules.norm import RMSNorm

needs_kernel = pytest.mark.skipif(not kernels.available("rms_norm"), reason="no C compiler builds the kernel")


def torch_rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def value_and_grads(fn, x, w, g):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = fn(x, w, 1e-5)
    (y * g.to(y.dtype)).sum().backward()
    return y.detach(), x.grad, w.grad


@needs_kernel
@pytest.mark.parametrize("shape", [(5, 64), (3, 37, 64), (2, 7, 24), (1, 1, 256)])
def test_as_close_to_exact_as_the_torch_expression(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = 3 * torch.randn(shape, generator=gen, dtype=torch.float64)
    w = torch.randn(shape[-1], generator=gen, dtype=torch.float64)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    exact = value_and_grads(torch_rms_norm, x, w, g)
    ours = value_and_grads(kernel_norm.native_rms_norm, x.float(), w.float(), g)
    plain = value_and_grads(torch_rms_norm, x.float(), w.float(), g)
    for e, a, b in zip(exact, plain, ours):
        floor = 1e-6 * (1 + float(e.abs().max()))
        assert float((b.double() - e).abs().max()) <= 4 * max(float((a.double() - e).abs().max()), floor)


@needs_kernel
def test_the_module_runs_the_kernel_on_fp32_cpu_only(monkeypatch):
    norm = RMSNorm(16, 1e-6)
    calls = []
    real = kernel_norm.native_rms_norm
    monkeypatch.setattr(kernel_norm, "native_rms_norm", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(4, 6, 16).transpose(0, 1)  # not contiguous
    torch.testing.assert_close(norm(x), torch_rms_norm(x, norm.weight, 1e-6), atol=1e-6, rtol=1e-5)
    assert calls == [1]
    norm(x.bfloat16())
    norm.double()(x.double())
    assert calls == [1]
    big = torch.randn(dispatch.TORCH_GRAIN_SIZE // 16 + 1, 16)  # where torch would use threads
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        norm.float()(big)
        assert calls == [1]
        torch.set_num_threads(1)
        norm(big)
        assert calls == [1, 1]
    finally:
        torch.set_num_threads(threads)
