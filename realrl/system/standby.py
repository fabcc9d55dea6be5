"""Standby worker processes for ``mode=local``: started before the launcher needs them.

A model worker spends its first seconds importing (torch, realrl's implementations,
transformers' tokenizer and config machinery: ~5 s on 2 CPU cores), and the launching process
spends its own first seconds importing and building the experiment's config (~3 s). Started one
after the other, the two add up. A standby process starts at once, imports what every worker
needs while the launcher is still busy, then waits for its assignment on stdin: one JSON line
naming the worker configs file, its index, the run's secret and its log file. Ray prestarts
its worker processes for the same reason.

A standby that is never assigned is stopped by ``close()``, or exits when its stdin ends; it dies
with the launching process like every local worker (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from realrl.base import logging
from realrl.base.processes import die_with_parent

logger = logging.getLogger("standby")

STANDBY_FLAG = "--standby"
# what every local worker process gets on top of the launcher's environment
WORKER_ENV = {"PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}


class StandbyWorkers:
    """A few idle worker processes, warmed up and waiting to be given a worker config."""

    def __init__(self, n: int = 0):
        self.procs: list[subprocess.Popen] = []
        self.early_logs: dict[int, str] = {}  # pid -> what the process printed before assignment
        self.spawn(n)

    def spawn(self, n: int) -> None:
        """Start ``n`` more standby processes (each in its own session, like a launched worker)."""
        for _ in range(n):
            fd, early = tempfile.mkstemp(prefix="realrl-standby-", suffix=".log")
            with os.fdopen(fd, "w") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "realrl.apps.remote", STANDBY_FLAG],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **WORKER_ENV},
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            self.procs.append(proc)
            self.early_logs[proc.pid] = early

    def assign(self, configs_path: str, index: int, secret: bytes, log_path: str) -> subprocess.Popen | None:
        """Hand worker ``index`` of ``configs_path`` to a live standby process; None when there is
        none left (or the ones left died): the launcher then starts a fresh process."""
        while self.procs:
            proc = self.procs.pop(0)
            early = self.early_logs.pop(proc.pid)
            order = {
                "configs": configs_path,
                "index": index,
                "secret": secret.hex(),
                "log": log_path,
                "early_log": early,
            }
            try:
                if proc.poll() is not None:
                    raise BrokenPipeError(f"exited with code {proc.returncode}")
                assert proc.stdin is not None
                proc.stdin.write((json.dumps(order) + "\n").encode())
                proc.stdin.close()
                return proc
            except (BrokenPipeError, OSError) as e:
                logger.warning("standby process %d is unusable (%s); trying another", proc.pid, e)
                proc.kill()
                proc.wait()
                _remove(early)
        return None

    def close(self) -> None:
        """Dismiss every standby process not assigned. They hold no state: stopped at once, even
        in the middle of their imports."""
        procs, self.procs = self.procs, []
        for proc in procs:
            try:
                assert proc.stdin is not None
                proc.stdin.close()
            except OSError:
                pass
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for early in self.early_logs.values():
            _remove(early)
        self.early_logs.clear()

    def __enter__(self) -> StandbyWorkers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def read_assignment(stream=None) -> dict | None:
    """In a standby process: block until the launcher's assignment arrives; None on end of input
    (dismissed). Then this process's output goes to the worker's log, after what it printed while
    it waited (import warnings, say)."""
    line = (stream or sys.stdin).readline()
    if not line.strip():
        return None
    order = json.loads(line)
    log_fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with open(order["early_log"], "rb") as f:
            os.write(log_fd, f.read())
    except OSError:
        pass
    _remove(order["early_log"])
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    return order
