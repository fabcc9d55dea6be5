"""Keep freed host memory in the process instead of handing it back to the OS every step.

A training step allocates and frees the same large activation buffers again and again. With
glibc's defaults, buffers above the (adaptive) mmap threshold are mmap'd and unmapped each time
and the heap top is trimmed, so every step page-faults its activations in anew (the kernel
zeroes each 4 KiB page): on the toy reward-model step, ~3,500 minor faults and ~10-15 % of the
step (``benchmarks/bench_host_memory.py``). Serving allocations from a heap that is never trimmed
removes them: what jemalloc/tcmalloc do for PyTorch on CPU, here with glibc's own ``mallopt``.
The cost: the process keeps its peak heap resident (its peak RSS is unchanged).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest; bigger blocks are still mmap'd
TRIM_THRESHOLD_BYTES = 1 << 30
TOP_PAD_BYTES = 64 * 1024 * 1024


def retain_freed_memory() -> bool:
    """Configure glibc malloc as above; False (and nothing changed) on other C libraries."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    settings = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (M_TOP_PAD, TOP_PAD_BYTES),
    )
    return all(libc.mallopt(param, value) == 1 for param, value in settings)
