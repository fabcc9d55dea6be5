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


def step():  # a training step's pattern: many 2 MiB activations live at once, then all freed
    ys = [x * 2 for _ in range(16)]
    del ys


for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
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
    # glibc's defaults trim the freed heap and page the next step's buffers in again (9k-160k
    # faults here); retained, the kept heap serves them (0-1k)
    assert default > 8 * retained + 1000, (default, retained)
