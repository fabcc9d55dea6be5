"""How the command lines stop on Ctrl-C (SIGINT) and SIGTERM.

A process started in the background by a non-interactive shell (``cmd &`` in a script, nohup,
CI runners) inherits SIGINT as *ignored* (POSIX), and Python then leaves it ignored: Ctrl-C and
``kill -INT`` would no longer stop the run. So the command lines install their own handlers
whatever they inherited. Both signals raise a ``KeyboardInterrupt`` in the main thread at once,
the path on which the launcher stops every worker (``realrl.apps.main``); recover points already
written stay (they are published by an atomic rename). The exit status is 128 + the signal's
number (130, 143), the shell's convention.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop the way Ctrl-C does (a ``KeyboardInterrupt``), remembering the signal."""

    signum = signal.SIGTERM


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Not Python's ``default_int_handler``, which ``asyncio.run`` replaces by a cancellation
    of its task: the launcher bounds the wait for cancelled tasks itself."""
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` and SIGTERM ``Terminated`` while the block runs; the
    handlers found on entry are put back on exit (a caller in the same process keeps its own)."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, _interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """Put back the SIGINT and SIGTERM handlers a library replaced in the block: ``ray.init``
    makes SIGTERM a plain ``sys.exit`` (no 143, no message); ours stop the run the same way."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():  # where handlers can be set
            for sig, handler in kept.items():
                if handler is not None and signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)


def interrupted_by(exc: KeyboardInterrupt) -> signal.Signals:
    """The signal behind an interruption: SIGTERM for ``Terminated``, else SIGINT."""
    return signal.Signals(getattr(exc, "signum", signal.SIGINT))


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(interrupted_by(exc))


def interrupted_message(exc: KeyboardInterrupt) -> str:
    return (
        f"realrl: interrupted by {interrupted_by(exc).name}; every worker was stopped "
        "(recover points already written are kept: continue with recover_mode=resume)"
    )
