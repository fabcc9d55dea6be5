"""Packed variable-length attention on the CPU from a small C kernel (``varlen_attention.c``):
the ``cpu_varlen`` attention backend, and the decoding steps that read a KV cache in place.

Why: RLHF batches on a CPU are many short sequences (a GRPO minibatch: 64 answers of ~25 tokens).
SDPA wants a padded [B, H, Lmax, D] grid and pays a fixed cost per (sequence, head) in its
kernel and in the scatter/gather around it; at these sizes that, not arithmetic, is the cost.
The kernel reads the packed rows in place: query r attends to the keys ``key(start[r] + j)``,
``j < count[r]``, with ``key = key_index`` under shared-prefix packing (``modules/shared_prefix.py``:
the sequences' copies of a prompt are one computed token) and the identity otherwise. Outputs
equal SDPA's up to float rounding, gradients too (tests/model/test_cpu_varlen.py).

Built on first use (``native.py``); whether a call runs here or on ``sdpa`` is
``dispatch.choose_kernel``'s. Work is split over ``dispatch.kernel_threads`` threads (the library
releases the GIL), each with its own key-gradient buffers.
"""

from __future__ import annotations

import concurrent.futures
import functools

import torch

from realrl.impl.model.kernels import dispatch, native


def _library():
    return native.library("varlen_attention")


@functools.cache
def _pool(n_threads: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(n_threads, thread_name_prefix="cpu_varlen")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[N, H, D] with unit strides inside a row (any row stride: a view of a fused qkv is fine)."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _chunks(start: torch.Tensor, count: torch.Tensor, n_heads: int) -> list[tuple[int, int]]:
    """Query ranges for the threads, cut only between runs (queries sharing a start)."""
    n, threads = start.shape[0], torch.get_num_threads()
    if threads > 1:
        threads = dispatch.kernel_threads(int(count.sum()) * n_heads, threads)
    if threads <= 1 or n < 2:
        return [(0, n)]
    bounds = torch.nonzero(start[1:] != start[:-1]).flatten() + 1  # first query of each run
    if bounds.numel() == 0:
        return [(0, n)]
    work = torch.cumsum(count, 0)
    targets = work[-1] * torch.arange(1, threads) / threads
    cuts = bounds[torch.searchsorted(work[bounds - 1], targets).clamp(max=bounds.numel() - 1)]
    edges = sorted({0, n, *cuts.tolist()})
    return list(zip(edges[:-1], edges[1:]))


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kidx, start, count, max_count: int, scale: float):
        lib = _library()
        n, hq, d = q.shape
        hkv = k.shape[1]
        out = torch.empty(n, hq, d, dtype=q.dtype, device=q.device)
        lse = torch.empty(n, hq, dtype=q.dtype, device=q.device)

        def run(a: int, b: int) -> int:
            return lib.varlen_attn_fwd(
                q.data_ptr() + a * q.stride(0) * 4, q.stride(0), b - a,
                k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(), v.stride(0), v.stride(1),
                _ptr(kidx), start.data_ptr() + a * 8, count.data_ptr() + a * 8, hq, hkv, d, scale,
                out.data_ptr() + a * hq * d * 4, lse.data_ptr() + a * hq * 4, max_count,
            )  # fmt: skip

        _check(_map(run, _chunks(start, count, hq)))
        ctx.save_for_backward(q, k, v, kidx, start, count, out, lse)
        ctx.max_count, ctx.scale = max_count, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, kidx, start, count, out, lse = ctx.saved_tensors
        lib = _library()
        dout = dout.contiguous()
        n, hq, d = q.shape
        hkv = k.shape[1]
        dq = torch.zeros(n, hq, d, dtype=q.dtype, device=q.device)
        chunks = _chunks(start, count, hq)
        # keys can be shared between runs (a shared prompt): each thread sums into its own dk/dv
        dkv = [torch.zeros(2, k.shape[0], hkv, d, dtype=k.dtype, device=k.device) for _ in chunks]

        def run(chunk: tuple[int, int], grads: torch.Tensor) -> int:
            a, b = chunk
            return lib.varlen_attn_bwd(
                q.data_ptr() + a * q.stride(0) * 4, q.stride(0), b - a,
                k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(), v.stride(0), v.stride(1),
                _ptr(kidx), start.data_ptr() + a * 8, count.data_ptr() + a * 8, hq, hkv, d, ctx.scale,
                out.data_ptr() + a * hq * d * 4, lse.data_ptr() + a * hq * 4, dout.data_ptr() + a * hq * d * 4,
                dq.data_ptr() + a * hq * d * 4, grads[0].data_ptr(), grads[1].data_ptr(), ctx.max_count,
            )  # fmt: skip

        if len(chunks) == 1:
            _check([run(chunks[0], dkv[0])])
        else:
            _check(list(_pool(len(chunks)).map(run, chunks, dkv)))
        grads = dkv[0] if len(dkv) == 1 else torch.stack(dkv).sum(0)
        return dq, grads[0], grads[1], None, None, None, None, None


def _map(run, chunks: list[tuple[int, int]]) -> list[int]:
    if len(chunks) == 1:
        return [run(*chunks[0])]
    return list(_pool(len(chunks)).map(lambda c: run(*c), chunks))


def _check(codes: list[int]) -> None:
    if any(codes):
        raise RuntimeError(f"cpu_varlen attention kernel failed with codes {codes} (1: out of memory)")


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    starts: torch.Tensor,
    counts: torch.Tensor,
    max_count: int,
    scale: float,
    key_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [N, Hq, D], k/v [T, Hkv, D] -> [N, Hq, D], differentiable: query r attends to the keys
    ``key(starts[r] + j)``, ``j < counts[r]`` (long [N] each, ``max_count`` the largest count),
    where ``key(i) = key_index[i]`` (long) or ``i``. Queries sharing a start (one sequence) must
    be consecutive."""
    return _VarlenAttention.apply(
        _rows(q), _rows(k), _rows(v), key_index, starts, counts, max_count, float(scale)
    )


def decode_attention(q, keys, values, lens, scale: float) -> torch.Tensor:
    """One decoding step: q [B, Hq, D], one query per row, against that row's slots
    ``0..lens[b]`` of a KV cache layer [B, Hkv, capacity, D], read in place (no mask, no copy)."""
    lib = _library()
    B, hq, d = q.shape
    hkv, capacity = keys.shape[1], keys.shape[2]
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("decode_attention reads a contiguous [B, Hkv, capacity, D] cache")
    q = _rows(q)
    out = torch.empty(B, hq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, hq, dtype=q.dtype, device=q.device)
    # key row i = b * Hkv * capacity + slot, rows D apart and heads capacity * D apart
    starts = torch.arange(B, dtype=torch.long) * (hkv * capacity)
    counts = (lens + 1).to(torch.long).contiguous()
    code = lib.varlen_attn_fwd(
        q.data_ptr(), q.stride(0), B, keys.data_ptr(), d, capacity * d, values.data_ptr(), d, capacity * d,
        None, starts.data_ptr(), counts.data_ptr(), hq, hkv, d, scale, out.data_ptr(), lse.data_ptr(),
        int(counts.max()) if B else 1,
    )  # fmt: skip
    _check([code])
    return out
