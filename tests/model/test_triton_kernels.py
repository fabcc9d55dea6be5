"""The GPU kernels: RMSNorm (``kernels/triton_norm.py``) gives the torch expression's results up to
float rounding, decoding attention (``kernels/triton_attention.py``) SDPA's on the masked cache, for
the dtypes and shapes the models hand them. On a CPU they run in Triton's interpreter (in a
subprocess: the interpreter is chosen when a kernel is built, once per process), skipped where
Triton is not installed; the interpreter has no bf16 matrix product, so attention is checked
there in fp32 and fp16. On a GPU (``gpu`` mark) they run compiled, picked by the dispatch rule,
and inside a CUDA graph."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from realrl.impl.model.kernels import dispatch
from realrl.impl.model.kernels.norm import torch_rms_norm
from realrl.impl.model.kernels.triton_attention import covers as attention_covers
from realrl.impl.model.kernels.triton_attention import triton_decode_attention
from realrl.impl.model.kernels.triton_norm import covers, triton_rms_norm

CASES = """
cases = [
    # (shape, x dtype, weight dtype): the llama hidden rows (bf16 activations next to fp32
    # master weights, and all-bf16 as the benchmarks load them), qwen3's per-head q/k norms
    # ([T, H, D]), a width that is no power of two, fp32, a non-contiguous view, no rows
    ((64, 2048), torch.bfloat16, torch.float32),
    ((37, 2048), torch.bfloat16, torch.bfloat16),
    ((5, 16, 128), torch.bfloat16, torch.float32),
    ((9, 100), torch.float32, torch.float32),
    ((0, 64), torch.bfloat16, torch.float32),
]
"""

CHECK = """
def check(x, w):
    got, want = triton_rms_norm(x, w, 1e-6), torch_rms_norm(x, w, 1e-6)
    assert got.dtype == want.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got, want)
    if EXACT and x.numel() and x.dtype != torch.float32:
        # the sum is reduced in another order, so fp32 results differ in their last bits; rounded
        # to bf16 they agree but for a rare flip (98-99 % equal on an H100, 2026-11-26)
        assert (got == want).float().mean().item() > 0.97

g = torch.Generator().manual_seed(0)
for shape, xd, wd in cases:
    x = (torch.randn(shape, generator=g) * 3).to(xd).to(DEVICE)
    w = (1 + torch.randn(shape[-1], generator=g) * 0.1).to(wd).to(DEVICE)
    check(x, w)
wide = torch.randn(8, 4096, generator=g).to(torch.bfloat16).to(DEVICE)
check(wide[:, ::2], torch.ones(2048, device=DEVICE))  # rows with a stride: copied first
print("checked", len(cases) + 1)
"""

ATTENTION = """
import torch.nn.functional as F

def reference(q, k, v, lens, scale):
    B, hq, d = q.shape
    hkv, cap = k.shape[1], k.shape[2]
    keep = torch.arange(cap, device=q.device)[None, :] <= lens[:, None]
    bias = torch.zeros(B, cap, device=q.device).masked_fill(~keep, float("-inf"))[:, None, None, :]
    grouped = q.float().reshape(B, hkv, hq // hkv, d)
    out = F.scaled_dot_product_attention(grouped, k.float(), v.float(), attn_mask=bias, scale=scale)
    return out.reshape(B, hq, d)

g = torch.Generator().manual_seed(1)
# (rows, query heads, KV heads, head dim, cache slots): GQA groups of 4 and 3 (padded to a tile),
# no grouping, a head dim that is no power of two, qwen's 128, a row whose only key is its own
for B, hq, hkv, d, cap in [(5, 8, 2, 64, 150), (4, 6, 2, 80, 20), (3, 4, 4, 32, 70), (2, 16, 2, 128, 300)]:
    for dtype in DTYPES:
        q = torch.randn(B, hq, d, generator=g).to(dtype).to(DEVICE)
        k = torch.randn(B + 2, hkv, cap, d, generator=g).to(dtype).to(DEVICE)  # rows: a prefix of a cache
        v = torch.randn(B + 2, hkv, cap, d, generator=g).to(dtype).to(DEVICE)
        lens = torch.randint(0, cap, (B,), generator=g).to(DEVICE)
        lens[0] = 0
        got = triton_decode_attention(q, k[:B], v[:B], lens, d**-0.5)
        assert got.dtype == dtype and got.shape == q.shape
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), reference(q, k[:B], v[:B], lens, d**-0.5), rtol=tol, atol=tol)
print("attention checked")
"""


def test_the_kernel_gives_the_torch_expression_in_triton_s_interpreter():
    pytest.importorskip("triton")
    program = "\n".join(
        [
            "import torch",
            "from realrl.impl.model.kernels.norm import torch_rms_norm",
            "from realrl.impl.model.kernels.triton_norm import triton_rms_norm",
            # the interpreter rounds fp32 to bf16 towards zero (a GPU to nearest): within an ulp
            "DEVICE, EXACT = 'cpu', False",
            textwrap.dedent(CASES),
            textwrap.dedent(CHECK),
        ]
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 6" in done.stdout


def test_the_rule_keeps_the_torch_code_off_a_gpu_and_where_a_kernel_does_not_cover_the_call():
    x, w = torch.randn(3, 8), torch.ones(8)
    assert not dispatch.use_triton("rms_norm", x, weight=w)  # a CPU tensor
    assert covers(x, w) and not covers(x, torch.ones(7))
    assert not covers(torch.randn(2, 20000), torch.ones(20000))  # a row wider than a program holds
    q, cache = torch.randn(2, 8, 64, dtype=torch.bfloat16), torch.zeros(2, 2, 16, 64, dtype=torch.bfloat16)
    assert attention_covers(q, cache, None)
    assert not attention_covers(q, cache, 4)  # a sliding window: SDPA's mask
    assert not attention_covers(q.float(), cache.float(), None)  # fp32: SDPA's exact path
    assert not attention_covers(q[:, :7], cache, None)  # heads that are no whole GQA groups
    assert not dispatch.use_triton("decode_attention", q, cache=cache)  # a CPU tensor
    with pytest.raises(ValueError, match="no Triton kernel"):
        dispatch.use_triton("varlen_attention", x, weight=w)


@pytest.mark.gpu
def test_on_a_gpu_calls_without_a_gradient_take_the_kernel_and_match_the_torch_expression():
    namespace = {
        "torch": torch,
        "torch_rms_norm": torch_rms_norm,
        "triton_rms_norm": triton_rms_norm,
        "triton_decode_attention": triton_decode_attention,
    }
    setup = "\nDEVICE, EXACT, DTYPES = 'cuda', True, (torch.bfloat16, torch.float16)\n"
    exec(textwrap.dedent(CASES) + setup + textwrap.dedent(CHECK) + textwrap.dedent(ATTENTION), namespace)
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(256, device="cuda", requires_grad=True)
    with torch.no_grad():
        assert dispatch.use_triton("rms_norm", x, weight=w)
    assert not dispatch.use_triton("rms_norm", x, weight=w)  # training: autograd needs the torch ops
    with dispatch.torch_only("rms_norm"), torch.no_grad():
        assert not dispatch.use_triton("rms_norm", x, weight=w)
    q, cache = (
        torch.randn(2, 8, 64, device="cuda", dtype=torch.bfloat16),
        torch.zeros(2, 2, 16, 64, device="cuda", dtype=torch.bfloat16),
    )
    assert dispatch.use_triton("decode_attention", q, cache=cache)


@pytest.mark.gpu
def test_the_norm_replays_in_a_cuda_graph():
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(2048, device="cuda") + 0.5
    out = triton_rms_norm(x, w, 1e-5)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_rms_norm(x, w, 1e-5)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch_rms_norm(x, w, 1e-5))
