"""Peak memory of one step, shared by the benchmarks that compare training steps' memory."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable


def status_mb(field: str) -> float:
    """A ``/proc/self/status`` field (``VmRSS``, ``VmHWM``) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def step_peak_rss(warm_up: Callable[[], None], step: Callable[[], None]) -> dict[str, float]:
    """The RSS before ``step`` and the peak RSS during it, in MiB, in this (fresh) process.

    ``warm_up`` runs first (first-call set-up is not training memory); then freed heap is handed
    back to the OS (glibc ``malloc_trim``) and the peak (VmHWM) is reset by writing 5 to
    /proc/self/clear_refs, so the peak counts what the step itself allocates.
    """
    warm_up()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_mb("VmRSS")
    step()
    return {"rss_before": before, "peak_rss": status_mb("VmHWM")}
