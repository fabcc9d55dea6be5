"""RMSNorm from a small C kernel (``rms_norm.c``): one pass over the rows forward and one
backward, where the torch expression makes five and eight passes over ``[T, hidden]`` (its cost on
the toy task's steps, by ablation: ~10 % of a reward-model step). ``rms_norm`` runs it where
``dispatch.choose_kernel`` says so (fp32 on the CPU, where torch would use one thread too) and the
torch expression everywhere else."""

from __future__ import annotations

import torch

from realrl.impl.model.kernels import dispatch, native
from realrl.impl.model.kernels.triton_norm import triton_rms_norm


def _library():
    return native.library("rms_norm")


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


def native_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The C kernel (fp32 CPU tensors, library built), differentiable."""
    return _RMSNorm.apply(x, weight, float(eps))


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalises in fp32 and casts back before the weight, as the HF llama family does; the
    result has ``x``'s dtype. With fp32 master weights under bf16 autocast, ``weight * h`` would
    promote a bf16 input to fp32: qwen3's per-head q/k norms would hand fp32 queries and keys to
    attention next to bf16 values, which the flash kernels and the KV cache do not take."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h.to(dtype)).to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2, -1) + eps)`` over the last dim, computed in fp32 and returned
    in ``x``'s dtype (whatever the weight's): the C kernel where ``dispatch.choose_kernel`` picks it,
    the Triton kernel where ``dispatch.use_triton`` does, else the torch expression."""
    if dispatch.use_native("rms_norm", x, weight=weight):
        return native_rms_norm(x, weight, eps)
    if dispatch.use_triton("rms_norm", x, weight=weight):
        return triton_rms_norm(x, weight, eps)
    return torch_rms_norm(x, weight, eps)
