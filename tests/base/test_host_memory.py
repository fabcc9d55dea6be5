"""The allocator setting takes effect: repeated large allocations stop page-faulting."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys
import torch
from realrl.base.host_memory import retain_freed_memory
if sys.argv[1] == "on":
    assert retain_freed_memory()
x = torch.randn(512, 1024)
for _ in range(3):
    (x * 2).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    y = x * 2  # a 2 MiB result, freed each time round
    del y
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc mallopt only"
)
def test_retained_memory_avoids_page_faults_on_reallocation():
    default, retained = _faults("off"), _faults("on")
    assert retained < 50, retained  # served from the kept heap
    assert default > 5 * max(retained, 1), (default, retained)  # glibc's defaults fault each time
