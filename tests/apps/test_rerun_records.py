"""A rerun into a trial folder keeps each run's records apart (the earlier one's under
``previous/``), a resumed run continues its own, and the command line says when the workers
outnumber the CPU cores (a warning) or the GPUs (a refusal, before anything is written).

Three tiny ``sft`` runs of the toy task through the command line, one after the other in one
trial folder: a first run of 1 step, a rerun of 2 steps, and a resume of the rerun to 3 steps."""

import glob
import json
import os
import subprocess
import sys

import pytest

from realrl.apps.configs import build_config
from realrl.apps.feasibility import local_devices, oversubscription
from realrl.apps.run_records import set_aside

TINY = ["dataset.train_bs_n_seqs=8"]
RECOVER = "exp_ctrl.ckpt_freq_steps=1"  # the rerun's recover points, which its resume starts from
LAYOUT = 'allocation_mode="actor:d3m1p1,*:d1m1p1@3"'  # 4 workers: actor on 0..2, the rest on 3


def cli(*args, env=None, one_core=False):
    """The command line, in a process of its own (on one CPU core when ``one_core``)."""
    pin = min(os.sched_getaffinity(0)) if one_core else None
    return subprocess.run(
        [sys.executable, "-m", "realrl.apps.quickstart", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        preexec_fn=(lambda: os.sched_setaffinity(0, {pin})) if one_core else None,
    )


def steps(path):
    with open(path) as f:
        return [json.loads(line)["step"] for line in f]


def event_files(folder):
    return sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))


def finished_runs(master_log):
    with open(master_log) as f:
        return sum(" finished " in line for line in f)


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    """The fileroot after a first run (1 step, 2 workers pinned to one core) and a rerun (2
    steps, one worker); with the two runs' outputs."""
    root = tmp_path_factory.mktemp("rerun")
    first = cli(
        "sft",
        f"fileroot={root}",
        "exp_ctrl.total_train_steps=1",
        "allocation_mode=d2",
        *TINY,
        one_core=True,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    rerun = cli("sft", f"fileroot={root}", "exp_ctrl.total_train_steps=2", RECOVER, *TINY)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    return str(root), first, rerun


def trial_dir(root):
    return os.path.join(root, "sft", "toy-seed1")


def test_more_workers_than_cores_is_said_in_one_warning_line(trial):
    _, first, rerun = trial
    warned = [line for line in first.stderr.splitlines() if "CPU core" in line]
    assert len(warned) == 1 and "WARNING" in warned[0], first.stderr[-3000:]
    assert "2 model workers on 1 CPU core(s)" in warned[0] and "allocation_mode" in warned[0]
    assert first.stderr.index(warned[0]) < first.stderr.index("model_worker/0")  # before any worker
    assert "CPU core" not in rerun.stderr  # one worker: nothing to say


def test_a_rerun_keeps_both_runs_records_apart(trial):
    root, first, rerun = trial
    run_dir = trial_dir(root)
    (previous,) = glob.glob(os.path.join(run_dir, "previous", "run-*"))
    assert steps(os.path.join(previous, "stats.jsonl")) == [1]  # the first run's, whole
    assert steps(os.path.join(run_dir, "stats.jsonl")) == [1, 2]  # the rerun's alone
    with open(os.path.join(previous, "summary.json")) as f, open(os.path.join(run_dir, "summary.json")) as g:
        assert (json.load(f)["steps"], json.load(g)["steps"]) == (1, 2)
    # TensorBoard: each run's folder holds its own event file only
    assert len(event_files(os.path.join(run_dir, "tensorboard"))) == 1
    assert len(event_files(os.path.join(previous, "tensorboard"))) == 1
    assert finished_runs(os.path.join(run_dir, "logs", "master.log")) == 1
    assert finished_runs(os.path.join(previous, "logs", "master.log")) == 1
    assert os.path.exists(os.path.join(previous, "logs", "model_worker-1.log"))  # the first run had 2
    assert not os.path.exists(os.path.join(run_dir, "logs", "model_worker-1.log"))
    # checkpoints are never moved: the rerun's are where every later phase looks for them
    assert os.path.exists(os.path.join(run_dir, "checkpoints", "default", "final", "config.json"))
    assert not os.path.exists(os.path.join(previous, "checkpoints"))
    said = [line for line in rerun.stderr.splitlines() if "previous" in line]
    assert len(said) == 1 and previous in said[0], rerun.stderr[-3000:]
    assert "previous" not in first.stderr  # a fresh folder: nothing to move, nothing said


def test_a_resumed_run_continues_its_own_records(trial):
    root, _, _ = trial
    run_dir = trial_dir(root)
    before = os.listdir(os.path.join(run_dir, "previous"))
    out = cli(
        "sft", f"fileroot={root}", "exp_ctrl.total_train_steps=3", RECOVER, *TINY, "recover_mode=resume"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "previous" not in out.stderr
    assert os.listdir(os.path.join(run_dir, "previous")) == before  # nothing more set aside
    assert "resumed from the recover point after step 2" in out.stderr
    assert steps(os.path.join(run_dir, "stats.jsonl")) == [1, 2, 3]  # steps 1, 2 kept, step 3 appended
    assert finished_runs(os.path.join(run_dir, "logs", "master.log")) == 2  # the same log, continued
    assert len(event_files(os.path.join(run_dir, "tensorboard"))) == 2  # the rerun's and its resume's


def test_a_folder_with_checkpoints_only_has_nothing_to_set_aside(tmp_path):
    run_dir = tmp_path / "sft" / "t"
    (run_dir / "checkpoints" / "default" / "final").mkdir(parents=True)
    (run_dir / "recover").mkdir()  # recover points without a run's records: nothing to go with
    assert set_aside(str(run_dir), str(tmp_path)) is None
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "recover"]


def test_an_earlier_runs_recover_points_go_with_its_records(tmp_path):
    """Left in place, they would be what a resume of the new run starts from (a point the new run
    may never have reached); the checkpoints stay for the phases that reuse them."""
    run_dir = tmp_path / "sft" / "t"
    (run_dir / "checkpoints" / "default" / "final").mkdir(parents=True)
    (run_dir / "recover" / "step2").mkdir(parents=True)
    (run_dir / "stats.jsonl").write_text("{}\n")
    target = set_aside(str(run_dir), str(tmp_path))
    assert sorted(os.listdir(target)) == ["recover", "stats.jsonl"]
    assert os.path.isdir(os.path.join(target, "recover", "step2"))
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "previous"]


# -- oversubscription: the counts come in as arguments (no GPU needed) ---------------------------


def four_workers(*extra):
    cfg = build_config("grpo", ["fileroot=unused", "device=cuda", LAYOUT, *extra])
    return cfg.initial_setup()


def test_more_cuda_workers_than_gpus_is_refused_naming_both_counts():
    with pytest.raises(ValueError, match=r"4 model workers but 2 GPU\(s\) are visible.*colocate=true"):
        local_devices(four_workers(), n_gpus=2)
    assert local_devices(four_workers(), n_gpus=4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def test_colocated_workers_may_share_the_gpus():
    # colocate=true: workers share GPUs round-robin
    assert local_devices(four_workers("colocate=true"), n_gpus=2) == ["cuda:0", "cuda:1"] * 2
    # models that share workers need no more GPUs than workers
    shared = build_config("grpo", ["fileroot=unused", "device=cuda", "allocation_mode=d2"]).initial_setup()
    assert local_devices(shared, n_gpus=2) == ["cuda:0", "cuda:1"]


def test_oversubscription_counts_workers_against_cores():
    exp = four_workers()
    assert "4 model workers on 2 CPU core(s)" in oversubscription(exp, cores=2)
    assert oversubscription(exp, cores=4) is None


def test_the_gpu_refusal_is_one_line_exit_2_and_writes_nothing(tmp_path):
    root = tmp_path / "out"
    # no standby worker processes: nothing to start for a run refused up front
    argv = ["grpo", f"fileroot={root}", "device=cuda", LAYOUT, "standby_workers=0"]
    out = cli(*argv, env={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines() == [
        "error: the sft phase this run builds on: device=cuda: no CUDA device is visible on this machine"
    ]
    assert not root.exists()
