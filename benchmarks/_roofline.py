"""The memory-bandwidth bound of decoding, for bench_generate.py.

A decoding step reads every weight once (whatever the batch) and each live sequence's cached keys
and values; at the device's memory bandwidth that takes at least bytes / bandwidth. For a run
whose sequences have prompt lengths p_i and generate g_i tokens, over max(g) steps:

    bytes = max(g) * weight_bytes + sum_i sum_{t < g_i} (p_i + t) * kv_bytes_per_token

and the roofline is sum(g) new tokens in bytes / bandwidth seconds. The bandwidth is measured
here, by copying a large buffer (read + write), not taken from a data sheet.
"""

from __future__ import annotations

import time

import torch

from realrl.impl.model.nn.static_decode import cache_bytes


def measured_bandwidth(device: str, gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second of a device-to-same-device copy (each byte read and written once)."""
    n = int(gib * 2**30) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / best


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """One token's keys and values in every layer: a static cache of one row and one slot."""
    return cache_bytes(1, 1, n_layers, n_kv_heads, head_dim, dtype)


def decode_bytes(prompt_lens: list[int], gen_lens: list[int], weights: int, kv_per_token: int) -> int:
    """Bytes a perfect decoder reads for these sequences (see the module docstring)."""
    steps = max(gen_lens, default=0)
    kv = sum(g * p + g * (g - 1) // 2 for p, g in zip(prompt_lens, gen_lens))
    return steps * weights + kv * kv_per_token


def roofline_tokens_per_s(
    prompt_lens: list[int], gen_lens: list[int], weights: int, kv_per_token: int, bandwidth: float
) -> float:
    seconds = decode_bytes(prompt_lens, gen_lens, weights, kv_per_token) / bandwidth
    return sum(gen_lens) / seconds


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
