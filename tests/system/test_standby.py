"""Standby worker processes: warmed up before the launcher needs them, then given a worker."""

from __future__ import annotations

import os
import signal
import time

from system_graphs import alive, mock_config, wait_all_exited, worker_pids

from realrl.apps.main import run_experiment
from realrl.system.standby import StandbyWorkers


def test_workers_run_in_standby_processes_and_the_next_run_gets_fresh_ones(tmp_path):
    cfg = mock_config(tmp_path, "standby", total_train_steps=2)  # two workers
    with StandbyWorkers(2) as standby:
        warmed = [p.pid for p in standby.procs]
        stats = run_experiment(cfg, "local", standby=standby, warm_next=True)
        assert [s["step"] for s in stats] == [1, 2]
        # each worker ran in one of the warmed-up processes, which wrote to the worker's own log
        assert sorted(worker_pids(cfg).values()) == sorted(warmed)
        assert alive(warmed) == []
        # warm_next: as many standby processes again, alive and waiting for the next run
        replacements = [p.pid for p in standby.procs]
        assert len(replacements) == 2 and set(replacements).isdisjoint(warmed)
        assert len(alive(replacements)) == 2
        early_logs = list(standby.early_logs.values())
    # dismissed: they exit on their own and leave no file behind
    assert wait_all_exited(replacements) == []
    assert not any(os.path.exists(p) for p in early_logs)


def test_a_dead_standby_process_is_replaced_by_a_fresh_worker(tmp_path):
    cfg = mock_config(tmp_path, "dead-standby", total_train_steps=1)
    with StandbyWorkers(1) as standby:
        victim = standby.procs[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        stats = run_experiment(cfg, "local", standby=standby)
    assert [s["step"] for s in stats] == [1]
    pids = worker_pids(cfg)
    assert sorted(pids) == ["model_worker/0", "model_worker/1"] and victim.pid not in pids.values()


def test_a_standby_process_that_is_never_used_is_stopped_at_once():
    standby = StandbyWorkers(1)
    proc, early_log = standby.procs[0], next(iter(standby.early_logs.values()))
    tik = time.monotonic()
    standby.close()  # still importing: stopped, not waited for
    assert time.monotonic() - tik < 2.0
    assert proc.returncode is not None and alive([proc.pid]) == []
    assert standby.procs == [] and not os.path.exists(early_log)


def test_a_dismissed_standby_process_exits_on_its_own(tmp_path):
    """Its stdin ends (the launching process went away without assigning it): exit code 0."""
    standby = StandbyWorkers(1)
    proc = standby.procs[0]
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    standby.close()
