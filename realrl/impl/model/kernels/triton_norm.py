"""RMSNorm as one Triton kernel on a GPU, for calls that need no gradient (decoding steps, prefill,
inference forwards).

The torch expression (``norm.torch_rms_norm``) launches eight kernels per call: the fp32 cast,
square, mean, ``+ eps``, rsqrt, product, the cast back and the weight. A decoding step of the 1.1B
llama makes 45 norm calls on [64, 2048] rows, each kernel a few microseconds whatever its size:
~1.5 ms of the 4.1 ms a CUDA-graph step took on an H100 (torch profiler, 2026-11-26,
``benchmarks/bench_generate.py --device cuda --size 1b``). Here one program normalises one row.

Same math as the torch expression, in the same order (the HF llama family's): the row normalised
in fp32, rounded to ``x``'s dtype, times the weight in fp32, rounded to ``x``'s dtype again. The
sum of squares is reduced in another order than torch's mean, so results agree to float rounding,
not bit for bit. Triton is imported on first use; without it (or with ``REALRL_NO_NATIVE=1``)
``available()`` is false and the torch expression runs.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from realrl.impl.model.kernels.native import DISABLE_ENV

MAX_COLS = 16384  # one program holds a whole row in registers
INTERPRET_ENV = "TRITON_INTERPRET"  # Triton's switch to its interpreter


@functools.cache
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def enabled() -> bool:
    """Triton's kernels may run: Triton imports and ``REALRL_NO_NATIVE`` is unset."""
    return os.environ.get(DISABLE_ENV, "") in ("", "0") and triton_importable()


@functools.cache
def _kernel():
    """The jitted kernel, or None where Triton does not import (built once per process)."""
    if not triton_importable():
        return None
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_rows(x_ptr, w_ptr, y_ptr, n_cols, x_stride, y_stride, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < n_cols
        x = tl.load(x_ptr + row * x_stride + cols, mask=inside, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)  # torch's rsqrt is the same approximation
        h = (x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)  # rounded before the weight
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * y_stride + cols, (w * h).to(y_ptr.dtype.element_ty), mask=inside)

    return rms_norm_rows


def available() -> bool:
    return enabled() and _kernel() is not None


def dense(t: torch.Tensor) -> bool:
    """A tensor that owns strided memory the kernel can read through its pointer: a plain tensor or
    a module's ``nn.Parameter`` of one (``RMSNorm.weight``). Not a tensor subclass: a DTensor
    (tensor parallelism, FSDP2's sharded parameters, which are ``nn.Parameter``s of DTensors and
    so of DTensor's type) or a collective's not-yet-waited output hold no such memory."""
    return type(t) in (torch.Tensor, nn.Parameter) and t.layout == torch.strided


def runs_on(device: torch.device) -> bool:
    """The kernel runs on ``device``: a CUDA device, or the CPU under Triton's interpreter
    (``TRITON_INTERPRET=1``, which runs kernels on CPU tensors: how the CPU tests run it inside
    a model)."""
    return device.type == "cuda" or (device.type == "cpu" and os.environ.get(INTERPRET_ENV) == "1")


def covers(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Dense tensors (``dense``), a weight per column, rows that fit a program."""
    return (
        dense(x)
        and dense(weight)
        and weight.dim() == 1
        and x.shape[-1] == weight.shape[0]
        and 0 < x.shape[-1] <= MAX_COLS
        and x.device == weight.device
    )


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2, -1) + eps)`` over the last dim in one kernel, in ``x``'s dtype.
    No gradient flows through it: ``dispatch.use_triton`` sends only calls that need none."""
    n_cols = x.shape[-1]
    rows = x.reshape(-1, n_cols)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = 1 << (n_cols - 1).bit_length()
        warps = 1 if block <= 256 else 4 if block <= 2048 else 8 if block <= 8192 else 16
        _kernel()[(rows.shape[0],)](
            rows, weight.contiguous(), out, n_cols, rows.stride(0), out.stride(0), float(eps),
            BLOCK=block, num_warps=warps,
        )  # fmt: skip
    return out.view(x.shape)
