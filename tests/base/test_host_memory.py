"""The allocator setting takes effect: freed activations stay in the process for the next step."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

SCRIPT = """
import os, sys
import torch
from realrl.base.host_memory import retain_freed_memory
if sys.argv[1] == "on":
    assert retain_freed_memory()
page = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page


buffers = [torch.ones(1024, 1024) for _ in range(16)]  # 64 MiB of activations, pages touched
held = rss()
del buffers  # the step ends
print((held - rss()) / 2**20)  # MiB handed back to the OS
"""


def _released_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc mallopt only"
)
def test_freed_memory_stays_in_the_process():
    """glibc's defaults unmap each 4 MiB block when it is freed (the next step faults it in again);
    retained, the blocks come from the heap, which is not trimmed."""
    default, retained = _released_mib("off"), _released_mib("on")
    assert default > 48, default
    assert retained < 8, retained
