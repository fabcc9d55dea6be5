"""Which attention backend a model runs: the CUDA varlen kernels only where they apply."""

from __future__ import annotations

import pytest
import torch

from realrl.impl.model.modules.attention import activation_dtype, resolve_attn_impl


def test_auto_is_sdpa_on_cpu_and_for_fp32_on_a_gpu():
    assert resolve_attn_impl("auto", "cpu", torch.bfloat16) == "sdpa"
    # fp32 activations on CUDA: the varlen kernels have no fp32 path, whatever is installed
    assert resolve_attn_impl("auto", "cuda", torch.float32) == "sdpa"


def test_explicit_cuda_kernel_with_fp32_or_on_cpu_is_a_clear_error():
    with pytest.raises(ValueError, match="fp16 or bf16"):
        resolve_attn_impl("torch_varlen", "cuda", torch.float32)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_attn_impl("flash_attn", "cpu", torch.bfloat16)
    with pytest.raises(ValueError, match="unknown attn_impl"):
        resolve_attn_impl("flash", "cuda", torch.bfloat16)


def test_activation_dtype_follows_autocast():
    cpu = torch.device("cpu")
    assert activation_dtype(torch.float32, cpu) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert activation_dtype(torch.float32, cpu) == torch.bfloat16
