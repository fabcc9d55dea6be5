"""How fast a run notices a lost worker: each failpoint of the fault tests, timed.

A watcher thread polls the victim process (psutil, every 10 ms) and records the moment it dies
(SIGKILL) or stops (SIGSTOP); the figure is the time from then until ``run_experiment`` raises,
which includes stopping every other worker. Runs the PPO-shaped mock graph of the runtime tests
(actor data parallel over workers 0 and 1, critic on 1, reward on 0) in local mode.

    python benchmarks/bench_faults.py [--cases 0:setup 0:train@2] [--signals SIGTERM] [--fileroot DIR]
    python benchmarks/bench_faults.py --smoke   # 2 failpoints (a kill, a stop) and 2 signals
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types

import psutil

SYSTEM_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "system")
sys.path.insert(0, SYSTEM_TESTS)

from _smoke import parse_args  # noqa: E402
from system_graphs import mock_config, single_call_config, wait_all_exited, worker_pids  # noqa: E402

from realrl.api.core.config import ModelInterfaceAbstraction  # noqa: E402
from realrl.api.core.system_api import Timeouts  # noqa: E402
from realrl.apps.main import ExperimentFailedError, run_experiment, save_config  # noqa: E402

TIMEOUTS = Timeouts(connect=90, heartbeat=2.0, heartbeat_interval=0.5)
CASES = [
    "0:setup",
    "1:initialize",
    "0:fetch@1",
    "1:generate@1",
    "1:inference@1",
    "0:train@2",
    "0:transfer",
    "0:save",
    "1:generate@1:stop",
]
# a signal sent to ``python -m realrl.apps.main``: (signal, started as a shell's background job)
SIGNALS = {
    "SIGINT": (signal.SIGINT, False),
    "SIGINT:bg": (signal.SIGINT, True),
    "SIGTERM": (signal.SIGTERM, False),
}


def watch(run_dir: str, victim: str, seen: list[float], stop: threading.Event) -> None:
    """Record when ``victim``'s process is gone or stopped."""
    log_dir = os.path.join(run_dir, "logs")
    while not stop.is_set():
        pids = worker_pids_in(log_dir)
        if victim in pids:
            try:
                status = psutil.Process(pids[victim]).status()
            except psutil.NoSuchProcess:
                status = psutil.STATUS_DEAD
            if status in (psutil.STATUS_DEAD, psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED):
                seen.append(time.monotonic())
                return
        time.sleep(0.01)


def worker_pids_in(log_dir: str) -> dict[str, int]:
    return worker_pids(types.SimpleNamespace(log_dir=log_dir)) if os.path.isdir(log_dir) else {}


def run_case(root: str, failpoint: str) -> tuple[float, str, bool]:
    trial = failpoint.replace(":", "-").replace("@", "-")
    cfg = mock_config(
        root, trial, total_train_steps=4, failpoints=[failpoint], timeouts=TIMEOUTS, save_freq_steps=1
    )
    victim = f"model_worker/{failpoint.split(':')[0]}"
    seen: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(cfg.run_dir, victim, seen, stop))
    watcher.start()
    try:
        run_experiment(cfg, "local")
        raise SystemExit(f"{failpoint}: the run did not fail")
    except ExperimentFailedError as e:
        failed = time.monotonic()
        error = str(e).splitlines()[0]
    finally:
        stop.set()
        watcher.join()
    left = wait_all_exited(worker_pids(cfg).values())
    return (failed - seen[0]) if seen else float("nan"), error, not left


def signal_case(root: str, signum: signal.Signals, background: bool) -> tuple[float, int, bool]:
    """Seconds from ``signum`` to the exit of ``python -m realrl.apps.main`` (started as a shell's
    background job when ``background``: SIGINT arrives ignored), its exit code, no worker left."""
    trial = f"{signum.name.lower()}{'-bg' if background else ''}"
    slow = ModelInterfaceAbstraction("sys_test_slow", {"delay": 0.3})
    cfg = single_call_config(root, trial, slow, steps=1000, n_samples=4000)
    path = os.path.join(root, f"{trial}.json")
    save_config(cfg, path)
    cmd = [sys.executable, "-m", "realrl.apps.main", path]
    env = {**os.environ, "PYTHONPATH": SYSTEM_TESTS}
    if background:
        shell = subprocess.Popen(
            ["bash", "-c", " ".join(cmd) + " & wait $!"], env=env, stdout=subprocess.DEVNULL
        )
        while not (kids := psutil.Process(shell.pid).children()):
            time.sleep(0.05)
        target, proc = kids[0], shell
    else:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        target = psutil.Process(proc.pid)
    while not os.path.exists(os.path.join(cfg.run_dir, "stats.jsonl")):
        if proc.poll() is not None:
            raise SystemExit(f"{trial}: the run exited ({proc.returncode}) before its first step")
        time.sleep(0.1)
    pids = worker_pids(cfg)
    tik = time.monotonic()
    target.send_signal(signum)
    code = proc.wait(timeout=120)
    return time.monotonic() - tik, code, not wait_all_exited(pids.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", nargs="*", default=CASES, help="failpoints to time (default: all)")
    parser.add_argument(
        "--signals", nargs="*", choices=sorted(SIGNALS), default=list(SIGNALS), help="default: all"
    )
    parser.add_argument("--fileroot", default=None, help="default: a fresh temporary folder")
    args = parse_args(
        parser, argv, cases=["0:train@2", "1:generate@1:stop"], signals=["SIGINT:bg", "SIGTERM"]
    )
    root = args.fileroot or tempfile.mkdtemp(prefix="realrl-faults-")
    os.makedirs(root, exist_ok=True)
    print(
        f"# bench_faults.py, {datetime.date.today()}, {os.cpu_count()} CPU cores; heartbeat limit {TIMEOUTS.heartbeat} s"
    )
    print("| failpoint | seconds from the fault to the run's error | no process left | error |")
    print("|---|---|---|---|")
    for failpoint in args.cases:
        seconds, error, clean = run_case(root, failpoint)
        print(f"| `{failpoint}` | {seconds:.2f} | {'yes' if clean else 'NO'} | {error} |", flush=True)
    print("\n| signal to the command line | seconds to its exit | exit code | no process left |")
    print("|---|---|---|---|")
    for name in args.signals:
        signum, background = SIGNALS[name]
        seconds, code, clean = signal_case(root, signum, background)
        how = f"{signum.name}{' (started as `bash -c ... & wait`, SIGINT inherited ignored)' if background else ''}"
        print(f"| {how} | {seconds:.2f} | {code} | {'yes' if clean else 'NO'} |", flush=True)
    print("command: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
