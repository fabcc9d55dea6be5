"""Child-process helpers shared by the local launcher and the standby workers."""

from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the process that started it dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
