"""Decoding attention on a GPU as one Triton kernel: one query per row against its cached prefix,
reading only the row's filled slots.

SDPA takes the cache's whole capacity under an additive mask, so every row reads every slot a
generate call reserved (the longest prompt plus the answer budget), filled or not; its
memory-efficient kernel also runs a query tile of 64 for the handful of query heads that share a
KV head. It took 42 us per layer call for 64 rows of a 1.1B llama (761 slots, 4 KV heads) on an
H100, against ~10 us to read those rows' filled slots at the card's bandwidth (torch profiler,
2026-11-26). Here one program takes one (row, KV head): its query heads (GQA) as the rows of one
tile, the row's keys in blocks up to its length (read on the device, so the same kernel replays
in a CUDA graph as the rows grow), with the streaming softmax of FlashAttention ("FlashAttention:
Fast and Memory-Efficient Exact Attention with IO-Awareness", Dao et al., 2022).

Covered: fp16/bf16 (the products run on tensor cores; fp32 keeps SDPA's exact path), head dims up
to 256, no sliding window, plain tensors. Triton is imported on first use (``triton_norm``'s rule).
"""

from __future__ import annotations

import functools

import torch

from realrl.impl.model.kernels.triton_norm import enabled, triton_importable

MAX_HEAD_DIM = 256
BLOCK_KEYS = 64  # keys per step of a program's loop


@functools.cache
def _kernel():
    """The jitted kernel, or None where Triton does not import (built once per process)."""
    if not triton_importable():
        return None
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attention(
        q_ptr, k_ptr, v_ptr, lens_ptr, o_ptr,
        q_row, q_head, k_row, k_head, k_slot, v_row, v_head, v_slot, o_row, o_head,
        scale, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1).to(tl.int64)
        n_keys = tl.load(lens_ptr + row) + 1  # the filled slots, the new token's included
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D_PAD)
        q_heads = kv_head * GROUP + g
        q_mask = (g < GROUP)[:, None] & (d < D)[None, :]
        q = tl.load(q_ptr + row * q_row + q_heads[:, None] * q_head + d[None, :], mask=q_mask, other=0.0)
        k_base = k_ptr + row * k_row + kv_head * k_head
        v_base = v_ptr + row * v_row + kv_head * v_head
        best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        total = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
        start = 0
        while start < n_keys:  # a while loop: Triton's interpreter takes no loaded bound in range()
            slots = start + tl.arange(0, BLOCK)
            inside = slots < n_keys
            kv_mask = inside[:, None] & (d < D)[None, :]
            k = tl.load(k_base + slots[:, None] * k_slot + d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(inside[None, :], s, float("-inf"))
            new_best = tl.maximum(best, tl.max(s, axis=1))
            p = tl.exp(s - new_best[:, None])
            rescale = tl.exp(best - new_best)
            v = tl.load(v_base + slots[:, None] * v_slot + d[None, :], mask=kv_mask, other=0.0)
            total = total * rescale + tl.sum(p, axis=1)
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
            best = new_best
            start += BLOCK
        out = acc / total[:, None]
        tl.store(
            o_ptr + row * o_row + q_heads[:, None] * o_head + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=q_mask,
        )

    return decode_attention


def covers(q: torch.Tensor, cache_k: torch.Tensor, window: int | None) -> bool:
    """Half-precision plain tensors on one device, whole GQA groups, no window."""
    return (
        type(q) is torch.Tensor
        and type(cache_k) is torch.Tensor
        and q.dtype in (torch.float16, torch.bfloat16)
        and cache_k.dtype == q.dtype
        and not window
        and q.shape[-1] <= MAX_HEAD_DIM
        and q.shape[1] % cache_k.shape[1] == 0
        and q.device == cache_k.device
    )


def available() -> bool:
    return enabled() and _kernel() is not None


def triton_decode_attention(
    q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [B, Hq, D] against ``cache_k``/``cache_v`` [B, Hkv, capacity, D] (rows may be a prefix of
    a larger cache), row b reading slots ``0..lens[b]``; returns [B, Hq, D] in q's dtype."""
    B, hq, d = q.shape
    hkv = cache_k.shape[1]
    group = hq // hkv
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((B, hq, d), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    for t in (cache_k, cache_v):
        if t.stride(-1) != 1:
            raise ValueError("the KV cache's head dim must be contiguous")
    _kernel()[(B, hkv)](
        q, cache_k, cache_v, lens, out,
        q.stride(0), q.stride(1), cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2), out.stride(0), out.stride(1),
        float(scale), GROUP=group, GROUP_PAD=max(16, 1 << (group - 1).bit_length()), D=d,
        D_PAD=max(16, 1 << (d - 1).bit_length()), BLOCK=BLOCK_KEYS, num_warps=4,
    )  # fmt: skip
    return out
