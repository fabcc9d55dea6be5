"""End to end: the master and two model workers run mock graphs as subprocesses and as Ray actors."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from system_graphs import (
    alive,
    deterministic,
    kill_when_running,
    mock_config,
    single_call_config,
    wait_all_exited,
    worker_pids,
)

from realrl.api.core.config import DatasetAbstraction, ModelInterfaceAbstraction
from realrl.apps.main import ExperimentFailedError, run_experiment


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    cfg = mock_config(tmp_path_factory.mktemp("local"), "local", total_train_epochs=2)
    stats = run_experiment(cfg, "local")
    return cfg, stats


def test_local_run_completes_every_step_and_frees_workers(local_run):
    cfg, stats = local_run
    # 16 samples, 2 data-parallel shards of 8, n_seqs 4 (2 per shard): 4 steps per epoch, 2 epochs
    assert [s["step"] for s in stats] == list(range(1, 9))
    assert [s["epoch"] for s in stats] == [1] * 4 + [2] * 4
    for i, s in enumerate(stats):
        assert s["actor_train/calls"] == i + 1  # each dp rank's interface ran once per step
        assert s["critic_train/calls"] == i + 1
        assert s["actor_train/n_seqs"] == 4  # the all-reduce over the actor's 2 dp ranks saw the batch
        assert set(s["timing"]) == {"gen", "values", "reward", "actor_train", "critic_train"}
    # Training moves w, and the next generation sees it (parameter-version rule): rewards change.
    ws = [s["actor_train/w"] for s in stats]
    assert all(b > a for a, b in zip(ws, ws[1:]))
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == list(range(1, 9))
    pids = worker_pids(cfg)
    assert sorted(pids) == ["model_worker/0", "model_worker/1"]
    assert alive(pids.values()) == []
    for w in (0, 1):  # every sample's tensors were freed once all MFCs were done with it
        with open(os.path.join(cfg.log_dir, f"model_worker-{w}.log")) as f:
            assert "exits as asked (0 live samples)" in f.read()


def test_evaluation_checkpoints_and_an_exact_resume(local_run, tmp_path):
    """4 steps with evaluations and recover points every 2, then a resumed run to 8 steps: its
    records (and the interface's call counter) continue exactly where the uninterrupted run went."""
    _, uninterrupted = local_run
    first = mock_config(
        tmp_path,
        "resume",
        total_train_steps=4,
        ckpt_freq_steps=2,
        save_freq_steps=2,
        eval_datasets=[DatasetAbstraction("sys_test_tokens", {"n": 6})],
        eval_freq_steps=2,
        eval_batch_size=2,
    )
    stats = run_experiment(first, "local")
    # evaluation every 2 steps, on each dp rank's shard of the 6 samples (actor: 2 ranks of 3)
    assert [s.get("actor_train/eval_n") for s in stats] == [None, 3.0, None, 3.0]
    assert [s.get("critic_train/eval_n") for s in stats] == [None, 6.0, None, 6.0]
    assert stats[1]["actor_train/eval_batches"] == 2.0  # batches of 2: [2, 1]
    without_eval = [{k: v for k, v in s.items() if "/eval_" not in k} for s in stats]
    assert deterministic(without_eval) == deterministic(uninterrupted)[:4]
    with open(os.path.join(first.run_dir, "checkpoints", "actor", "step2", "scalar.json")) as f:
        assert json.load(f) == {"w": uninterrupted[1]["actor_train/w"], "version": 2}
    with open(os.path.join(first.run_dir, "checkpoints", "critic", "final", "scalar.json")) as f:
        assert json.load(f)["version"] == 4
    assert sorted(os.listdir(os.path.join(first.run_dir, "recover"))) == ["latest.json", "step2", "step4"]
    resumed_cfg = mock_config(tmp_path, "resume", total_train_epochs=2, ckpt_freq_steps=2, resume=True)
    resumed = run_experiment(resumed_cfg, "local")
    assert [s["step"] for s in resumed] == [5, 6, 7, 8]
    assert deterministic(resumed) == deterministic(uninterrupted)[4:]
    with open(os.path.join(first.run_dir, "stats.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == list(range(1, 9))


def test_ray_mode_gives_the_same_stats_as_local(local_run, tmp_path, ray_cluster):
    _, stats = local_run
    cfg = mock_config(tmp_path, "ray", total_train_epochs=2)
    ray_stats = run_experiment(cfg, "ray")
    assert deterministic(ray_stats) == deterministic(stats)
    pids = worker_pids(cfg)
    assert len(pids) == 2
    assert wait_all_exited(pids.values()) == []


@pytest.mark.parametrize("mode", ["local", "ray"])
def test_interface_exception_reaches_the_master_with_its_traceback(tmp_path, mode, request):
    if mode == "ray":  # ReaL's users: "Ray does not propagate worker errors"
        request.getfixturevalue("ray_cluster")
    cfg = single_call_config(tmp_path, f"raise-{mode}", "sys_test_raise")
    tik = time.monotonic()
    with pytest.raises(ExperimentFailedError) as info:
        run_experiment(cfg, mode)
    message = str(info.value)
    assert info.value.worker in ("model_worker/0", "model_worker/1")
    assert "ValueError: boom from the mock interface" in message
    assert "Traceback" in message and "mock_plugins.py" in message and "in inference" in message
    assert "last lines of model_worker/" in message
    assert time.monotonic() - tik < 60
    assert wait_all_exited(worker_pids(cfg).values()) == []


@pytest.mark.parametrize("mode", ["local", "ray"])
def test_killing_a_worker_stops_the_run_naming_it(tmp_path, mode, request):
    if mode == "ray":
        request.getfixturevalue("ray_cluster")
    slow = ModelInterfaceAbstraction("sys_test_slow", {"delay": 0.3})
    cfg = single_call_config(tmp_path, f"kill-{mode}", slow, steps=1000, n_samples=4000)
    killed_at = []
    killer = threading.Thread(target=lambda: killed_at.append(kill_when_running(cfg, "model_worker/1")))
    killer.start()
    with pytest.raises(ExperimentFailedError) as info:
        run_experiment(cfg, mode)
    stopped_at = time.monotonic()
    killer.join()
    assert killed_at and killed_at[0] is not None, "the run never got going"
    assert stopped_at - killed_at[0] < 30
    assert info.value.worker == "model_worker/1"
    assert "model_worker/1" in str(info.value) and "last lines of model_worker/1's log" in str(info.value)
    pids = worker_pids(cfg)
    assert wait_all_exited(pids.values()) == []


def test_ray_workers_that_cannot_be_scheduled_fail_at_once(tmp_path, ray_cluster):
    cfg = mock_config(tmp_path, "too-big", total_train_steps=1)
    tik = time.monotonic()
    with pytest.raises(ExperimentFailedError, match="do not fit the Ray cluster's 4 CPUs"):
        run_experiment(cfg, "ray", ray_cpus_per_worker=3)
    assert time.monotonic() - tik < 30  # not after the connect timeout
