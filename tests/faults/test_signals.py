"""Ctrl-C (SIGINT) and SIGTERM stop a run and every worker, keep the recover points already
written, and exit within seconds with 128 + the signal's number, even when the command line was
started in the background by a shell, which hands it SIGINT ignored (POSIX)."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from system_graphs import alive, single_call_config, wait_all_exited, worker_pids

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.apps.main import save_config
from realrl.apps.signals import Terminated, exit_code, handlers_kept, stop_on_signals

STOPPED_WITHIN_S = 20  # from the signal to the exit of the command line, workers stopped


def _wait_for(path: str, proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, f"exited with {proc.returncode} before {path} appeared"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.1)


def _python_child(shell: psutil.Process, timeout: float = 30) -> psutil.Process:
    """The python process a ``bash -c 'python ... & wait $!'`` started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = [p for p in shell.children() if "python" in p.name().lower()]
        if kids:
            return kids[0]
        time.sleep(0.05)
    raise AssertionError("bash started no python child")


def test_a_background_job_of_a_shell_starts_with_sigint_ignored():
    """The premise: what every CLI run started by ``cmd &`` in a script inherits."""
    probe = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"
    out = subprocess.run(
        ["bash", "-c", f"{sys.executable} -c '{probe}' & wait $!"], capture_output=True, text=True, timeout=30
    )
    assert out.stdout.strip() == "True"


def test_the_handlers_are_installed_whatever_was_inherited_and_put_back():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a script
    try:
        with stop_on_signals():
            with pytest.raises(KeyboardInterrupt) as info:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises here
            assert exit_code(info.value) == 130
            with pytest.raises(Terminated) as info:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
            assert exit_code(info.value) == 143
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_library_that_takes_sigterm_gives_it_back():
    """``ray.init`` installs its own SIGTERM handler (a plain exit); the launcher keeps ours."""
    with stop_on_signals():
        ours = signal.getsignal(signal.SIGTERM)
        with handlers_kept():
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        assert signal.getsignal(signal.SIGTERM) is ours


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_every_worker_and_exits_128_plus_its_number(tmp_path, signum, status):
    slow = ModelInterfaceAbstraction("sys_test_slow", {"delay": 0.3})
    cfg = single_call_config(tmp_path, signum.name.lower(), slow, steps=1000, n_samples=4000)
    path = tmp_path / "config.json"
    save_config(cfg, str(path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "realrl.apps.main", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for(os.path.join(cfg.run_dir, "stats.jsonl"), proc)
        pids = worker_pids(cfg)
        assert len(pids) == 2
        tik = time.monotonic()
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=STOPPED_WITHIN_S)
        took = time.monotonic() - tik
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, out.decode()[-2000:]
    assert f"interrupted by {signum.name}; every worker was stopped".encode() in out
    assert b"Traceback" not in out
    assert wait_all_exited(pids.values(), timeout=5) == [] and took < STOPPED_WITHIN_S


def test_ctrl_c_stops_a_background_cli_run_and_keeps_its_recover_point(tmp_path):
    """``cmd &`` in a script: SIGINT comes ignored, the CLI stops on it all the same."""
    run_dir = tmp_path / "sft" / "toy-seed1"
    args = [
        f"fileroot={tmp_path}",
        "dataset.train_bs_n_seqs=8",
        "exp_ctrl.total_train_epochs=50",  # minutes of steps: it is stopped long before
        "exp_ctrl.ckpt_freq_steps=10",
    ]
    command = " ".join([sys.executable, "-m", "realrl.apps.quickstart", "sft", *args])
    log = tmp_path / "out.txt"
    with open(log, "wb") as out:  # a file, not a pipe: the run logs every step, nobody must read
        shell = subprocess.Popen(["bash", "-c", f"{command} & wait $!"], stdout=out, stderr=subprocess.STDOUT)
    child = _python_child(psutil.Process(shell.pid))
    try:
        latest = run_dir / "recover" / "latest.json"
        _wait_for(str(latest), shell)
        step = json.loads(latest.read_text())["step"]
        workers = child.children(recursive=True)
        assert workers, "no worker process"
        tik = time.monotonic()
        child.send_signal(signal.SIGINT)
        shell.wait(timeout=STOPPED_WITHIN_S)
        took = time.monotonic() - tik
    finally:
        if child.is_running():
            child.kill()  # its workers die with it (PR_SET_PDEATHSIG)
        shell.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert shell.returncode == 130, text[-2000:]  # bash's `wait $!`: the python child's status
    assert "interrupted by SIGINT; every worker was stopped" in text and "Traceback" not in text
    assert alive([p.pid for p in workers]) == [] and took < STOPPED_WITHIN_S
    kept = json.loads(latest.read_text())["step"]  # the last complete point, still there
    assert kept >= step and (run_dir / "recover" / f"step{kept}").is_dir()
