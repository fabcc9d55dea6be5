"""A process's peak memory so far, host and accelerator, for the records of a run: each model
worker reports its own with every reply, and a run's summary says what each phase held at most.
"""

from __future__ import annotations

import platform
import resource
import sys

GB = 2**30


def peak_rss_bytes() -> int:
    """The largest resident set this process has had (``getrusage``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if platform.system() == "Darwin" else peak * 1024)


def process_peaks() -> dict[str, float]:
    """``host_rss_gb``: the peak resident memory of this process; ``device_gb``: the most memory
    torch's CUDA allocator has held at once (only where CUDA is initialised, so a CPU process
    never imports or starts it for this)."""
    peaks = {"host_rss_gb": round(peak_rss_bytes() / GB, 4)}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        peaks["device_gb"] = round(torch.cuda.max_memory_allocated() / GB, 4)
    return peaks
