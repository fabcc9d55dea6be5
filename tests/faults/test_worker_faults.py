"""A worker that dies or hangs at each phase of a run: the run stops, the error names the worker
and what it was running, and no process is left behind.

Failures are put in place with failpoints (``realrl.base.failpoints``): the victim SIGKILLs (or
SIGSTOPs) itself as it reaches the named point, on the PPO-shaped mock graph (actor data parallel
over workers 0 and 1, critic on 1, reward on 0). A reallocation's failure needs real models and
is tested in tests/system/test_ppo_runtime.py.
"""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest
from system_graphs import mock_config, wait_all_exited, worker_pids

from realrl.api.core.system_api import Timeouts
from realrl.apps.main import ExperimentFailedError, run_experiment

# SIGSTOP is seen by the heartbeat: a worker silent for 2 s is lost
TIMEOUTS = Timeouts(connect=90, heartbeat=2.0, heartbeat_interval=0.5)


def config(tmp_path, trial: str, failpoint: str, **extra):
    return mock_config(
        tmp_path, trial, total_train_steps=4, failpoints=[failpoint], timeouts=TIMEOUTS, **extra
    )


def fails(cfg) -> tuple[ExperimentFailedError, float]:
    tik = time.monotonic()
    with pytest.raises(ExperimentFailedError) as info:
        run_experiment(cfg, "local")
    elapsed = time.monotonic() - tik
    assert wait_all_exited(worker_pids(cfg).values()) == [], "a worker process was left behind"
    return info.value, elapsed


@pytest.mark.parametrize(
    "failpoint, victim, doing",
    [
        ("0:setup", "model_worker/0", "while running setup"),
        ("1:initialize", "model_worker/1", "while running initialize"),
        ("0:fetch@1", "model_worker/0", "while running fetching the dataset batch of step 1"),
        ("1:generate@1", "model_worker/1", "while running MFC 'gen' (step 1)"),
        ("1:inference@1", "model_worker/1", "while running MFC 'values' (step 1)"),
        ("0:train@2", "model_worker/0", "while running MFC 'actor_train' (step 2)"),
        # worker 0's first transfer: the half of gen's answers worker 1 pushed to the reward call
        ("0:transfer", "model_worker/0", "while running MFC 'reward' (step 0)"),
        ("0:save", "model_worker/0", "while running save"),
    ],
)
def test_a_worker_killed_at_each_phase_stops_the_run_naming_it(tmp_path, failpoint, victim, doing):
    trial = failpoint.replace(":", "-").replace("@", "-")
    error, elapsed = fails(config(tmp_path, trial, failpoint, save_freq_steps=1))
    assert error.worker == victim
    assert "was killed by SIGKILL" in str(error) and doing in str(error), str(error)
    assert elapsed < 60


def test_a_hung_worker_is_found_by_its_silence_within_two_heartbeat_limits(tmp_path):
    """SIGSTOP (a hang: the process lives but does nothing) during generation: the master notices
    the silence and stops the run; the stopped process is killed too."""
    cfg = config(tmp_path, "hang", "1:generate@1:stop")
    stopped_at: list[float] = []

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stopped_at:
            pid = worker_pids(cfg).get("model_worker/1") if os.path.isdir(cfg.log_dir) else None
            try:
                if pid is not None and psutil.Process(pid).status() == psutil.STATUS_STOPPED:
                    stopped_at.append(time.monotonic())
            except psutil.Error:
                pass
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    error, _ = fails(cfg)
    failed_at = time.monotonic()
    watcher.join()
    assert stopped_at, "the worker never stopped"
    assert error.worker == "model_worker/1" and "no heartbeat" in str(error)
    assert "while running MFC 'gen' (step 1)" in str(error)
    assert failed_at - stopped_at[0] < 2 * TIMEOUTS.heartbeat + 1.0  # + the guard's and watcher's polling
