"""RMSNorm on the CPU from a small C kernel (``cpu_rms_norm.c``): one pass over the rows forward
and one backward, where the torch expression makes five and eight passes over ``[T, hidden]``
(its cost on the toy task's steps, by ablation: ~10 % of a reward-model step). Built on first
use like ``cpu_varlen``; fp32 on the CPU only, the torch expression everywhere else."""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from realrl.base import native_build

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_rms_norm.c")
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = native_build.load(SOURCE)
    if lib is not None:
        lib.rms_norm_fwd.argtypes = [_P, _P, _I, _I, _F, _P, _P]
        lib.rms_norm_bwd.argtypes = [_P, _P, _P, _P, _I, _I, _P, _P]
        lib.rms_norm_fwd.restype = lib.rms_norm_bwd.restype = None
    return lib


# torch runs an elementwise op on one thread up to this many elements (ATen's GRAIN_SIZE)
TORCH_GRAIN_SIZE = 32768


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """fp32 on the CPU, where torch would run on one thread too: the kernel has one. Plain tensors
    only: the kernel reads raw pointers, which a tensor subclass (a tensor-parallel collective's
    not-yet-waited output) does not offer."""
    return (
        type(x) is torch.Tensor
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and (torch.get_num_threads() == 1 or x.numel() <= TORCH_GRAIN_SIZE)
        and weight.dtype == torch.float32
        and x.shape[-1] == weight.shape[0]
        and _library() is not None
    )


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rows = x.contiguous().view(-1, x.shape[-1])
        weight = weight.contiguous()
        y = torch.empty_like(rows)
        rstd = torch.empty(rows.shape[0], dtype=torch.float32)
        _library().rms_norm_fwd(
            rows.data_ptr(),
            weight.data_ptr(),
            rows.shape[0],
            rows.shape[1],
            eps,
            y.data_ptr(),
            rstd.data_ptr(),
        )
        ctx.save_for_backward(rows, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        rows, weight, rstd = ctx.saved_tensors
        dy = dy.contiguous().view(rows.shape)
        dx = torch.empty_like(rows)
        dw = torch.zeros_like(weight)
        _library().rms_norm_bwd(
            rows.data_ptr(), weight.data_ptr(), rstd.data_ptr(), dy.data_ptr(), rows.shape[0], rows.shape[1],
            dx.data_ptr(), dw.data_ptr(),
        )  # fmt: skip
        return dx.view(ctx.x_shape), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2, -1) + eps)``, as ``norm.RMSNorm`` computes it in fp32."""
    return _RMSNorm.apply(x, weight, float(eps))
