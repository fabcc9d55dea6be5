"""Exact resume of every trained experiment on the toy task: a run SIGKILLed (the CLI and its
workers, the whole process group) after a recover point and resumed with
``recover_mode=resume`` ends with the records and the final weights of a run never interrupted,
bit for bit (CPU, fp32).

Recover points every 2 of 5 steps, so the kill always lands between a point and the end.
The SFT and reward-model prerequisites run once (4 steps) in one module-scoped fileroot.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import Model
from realrl.apps.configs import build_config
from realrl.apps.run import run_quickstart
from realrl.base.network import find_free_port
from realrl.impl.interface.rw_interface import PairedRewardInterface

STEPS = 5
SHORT = [
    f"exp_ctrl.total_train_steps={STEPS}",
    "exp_ctrl.ckpt_freq_steps=2",
    "dataset.train_bs_n_seqs=8",
    'prerequisite_overrides=["exp_ctrl.total_train_steps=4","dataset.train_bs_n_seqs=8"]',
]
RL = ["ppo.ppo_n_minibatches=2", "toy_eval_prompts=8"]
EXTRA = {"sft": [], "rw": [], "dpo": [], "ppo": RL, "grpo": RL}
WALL_CLOCK = ("time", "timing", "memory")  # what may differ between two runs with the same numbers


@pytest.fixture(scope="module")
def fileroot(tmp_path_factory):
    return str(tmp_path_factory.mktemp("resume"))


# generation on worker 1 up to 2 steps ahead of training on worker 0
ASYNC = ['allocation_mode="actor_gen:d1m1p1@1,*:d1m1p1"', "async_rl.enabled=true", "async_rl.max_staleness=2"]


def overrides(name: str, fileroot: str, trial: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [f"fileroot={fileroot}", f"trial_name={trial}", *SHORT, *EXTRA[name], *extra]


def records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not wall_clock(k)} for r in rows]


def wall_clock(key: str) -> bool:
    """What may differ between two runs with the same numbers: times (asynchronous RL's idle
    times among them), and what the weight pushes cost (``push/*``: the seconds they blocked, and
    only the calls this process ran report one; a resumed run restores its first generations)."""
    return key in WALL_CLOCK or key.endswith("seconds") or key.startswith(("async/idle_s/", "push/"))


def final_files(run_dir: str) -> dict[str, str]:
    """Every weights and state file of the final HF checkpoints, by path under checkpoints/."""
    root = os.path.join(run_dir, "checkpoints")
    files = glob.glob(os.path.join(root, "*", "final", "*.safetensors"))
    files += glob.glob(os.path.join(root, "*", "final", "*_state.json"))
    files += glob.glob(os.path.join(root, "*", "final", "reward_normalization.json"))
    return {os.path.relpath(f, root): f for f in sorted(files)}


def kill_after_a_recover_point(name: str, fileroot: str, trial: str, extra: tuple[str, ...] = ()) -> int:
    """Start the CLI, SIGKILL its process group as soon as a recover point is marked; return the
    step that point holds."""
    cmd = [sys.executable, "-m", "realrl.apps.quickstart", name, *overrides(name, fileroot, trial, extra)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    latest = os.path.join(fileroot, name, trial, "recover", "latest.json")
    deadline = time.monotonic() + 300
    while not os.path.exists(latest) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert os.path.exists(latest), err.decode()[-3000:]
    with open(latest) as f:
        return int(json.load(f)["step"])


def assert_same_run(a: str, b: str) -> None:
    assert records(b) == records(a)
    fa, fb = final_files(a), final_files(b)
    assert fa and fa.keys() == fb.keys()
    for rel, path in fa.items():
        if rel.endswith(".json"):
            with open(path) as f, open(fb[rel]) as g:
                assert json.load(g) == json.load(f), rel
            continue
        wa, wb = load_file(path), load_file(fb[rel])
        assert wa.keys() == wb.keys(), rel
        for k in wa:
            torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=0, msg=f"{rel}: {k}")


def resumes_exactly(name: str, fileroot: str, extra: tuple[str, ...] = (), label: str = "") -> int:
    """Run straight, then killed and resumed; the same records and weights. The step resumed from."""
    straight = build_config(name, overrides(name, fileroot, f"{label}straight", extra))
    run_quickstart(name, straight)
    step = kill_after_a_recover_point(name, fileroot, f"{label}killed", extra)
    assert 0 < step < STEPS
    resumed = build_config(name, [*overrides(name, fileroot, f"{label}killed", extra), "recover_mode=resume"])
    summary = run_quickstart(name, resumed)
    assert summary["steps"] == STEPS - step  # it did resume: only the steps after the point ran
    assert_same_run(straight.run_dir, resumed.run_dir)
    return step


# PPO's three runs take ~40 s: with the slow ones (the frozen reward model's state is also tested
# on its own below), so that the default suite stays under 15 minutes on 2 cores
@pytest.mark.parametrize("name", ["sft", pytest.param("ppo", marks=pytest.mark.slow)])
def test_a_killed_run_resumes_to_the_same_records_and_weights(fileroot, name):
    """PPO: the reward model's normalisation (fitted on the first batch, a frozen role) comes
    from the recover point; refitted on the trained policy's samples it would differ."""
    resumes_exactly(name, fileroot)
    if name == "ppo":
        point = os.path.join(fileroot, "ppo", "killed", "recover", f"step{STEPS}")
        assert os.path.isfile(os.path.join(point, "reward", "rew_inf.rank0.state.pt"))


@pytest.mark.slow
def test_an_asynchronous_run_resumes_to_the_same_records_and_weights(fileroot):
    """Asynchronous GRPO (generation 2 steps ahead on its own worker): the answers drawn from
    weights older than the recover point's come from the point itself, so the resumed run trains
    on exactly the samples the uninterrupted one did."""
    resumes_exactly("grpo", fileroot, ASYNC, "async-")
    recover = os.path.join(fileroot, "grpo", "async-killed", "recover")
    points = sorted(int(d[len("step") :]) for d in os.listdir(recover) if d.startswith("step"))
    assert [p for p in points if p < STEPS]  # a point before the end, holding answers in flight
    for p in points:  # the calls of steps p .. p + 1 sampled from weights older than p's
        kept = os.listdir(os.path.join(recover, f"step{p}", "inflight")) if p < STEPS else []
        expected = range(p, min(p + 2, STEPS))
        assert sorted(f for f in kept if f.endswith(".json")) == [f"actor_gen.step{k}.json" for k in expected]
        assert sorted(f for f in kept if f.endswith(".pt")) == [
            f"actor_gen.step{k}.part0.pt" for k in expected
        ]


@pytest.mark.slow
def test_a_pipelined_run_resumes_to_the_same_records_and_weights(fileroot):
    """SFT on two pipeline stages: each rank's recover point holds its stage's weights and
    optimizer state (``torch.distributed.checkpoint``), and the final HF folder is gathered."""
    resumes_exactly("sft", fileroot, ("allocation_mode=d1m1p2",), "pp-")


@pytest.mark.slow
def test_a_compiled_run_resumes_compiled_to_the_same_records_and_weights(fileroot):
    """SFT with the blocks compiled (``model.engine.compile=on``): the resumed process compiles
    again (warm from the run's Inductor cache) and computes the same bits."""
    cache = os.path.join(fileroot, ".inductor_cache")
    compiled = ("model.engine.compile=on", f"model.engine.compile_cache_dir={cache}")
    resumes_exactly("sft", fileroot, compiled, "compiled-")
    with open(os.path.join(fileroot, "sft", "compiled-straight", "stats.jsonl")) as f:
        assert json.loads(f.readline())["trainDefault/compile/graphs"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rw", "dpo", "grpo"])
def test_other_experiments_resume_to_the_same_records_and_weights(fileroot, name):
    resumes_exactly(name, fileroot)


# -- the state a frozen reward model keeps -----------------------------------------------------

SCORES = [[0.0, 1.0, 2.0], [10.0, 20.0, 30.0, 40.0, 50.0]]  # one dp rank's raw rewards each


class Scores:
    """A reward model's engine that returns fixed raw scores, one per sequence."""

    def __init__(self, scores: list[float], dp_group=None):
        self.scores, self.dp_group = torch.tensor(scores), dp_group

    def forward(self, data, mb_spec, post_hook=None, output_index_fn=None):
        return self.scores


def batch(n: int) -> SequenceSample:
    return SequenceSample.from_default(
        list(range(n)), [2] * n, {"packed_input_ids": torch.zeros(2 * n).long()}
    )


def fit_on_rank(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        rew = PairedRewardInterface(normalize_on_first_inference=True)
        model = Model("reward", Scores(SCORES[rank], dist.group.WORLD), None)
        rewards = rew.inference(model, batch(len(SCORES[rank]))).data["rewards"]
        torch.save({"state": rew.state_dict(), "rewards": rewards}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_the_reward_normalisation_is_fitted_on_the_whole_batch_and_saved(tmp_path):
    """Data parallel over 2 ranks, each rank fits the moments of the whole batch (not of its
    share): the layout does not change the rewards. ``state_dict`` carries the fit to a resumed
    run, which then does not fit again."""
    mp.spawn(fit_on_rank, args=(find_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    whole = PairedRewardInterface(normalize_on_first_inference=True)
    one = Model("reward", Scores(SCORES[0] + SCORES[1]), None)
    expected = whole.inference(one, batch(8)).data["rewards"]
    for r in ranks:
        assert r["state"] == whole.state_dict() and r["state"]["normalized_once"]
    torch.testing.assert_close(torch.cat([r["rewards"] for r in ranks]), expected)
    resumed = PairedRewardInterface(normalize_on_first_inference=True)
    resumed.load_state_dict(ranks[0]["state"])
    later = Model("reward", Scores([5.0, 6.0]), None)  # a trained policy's samples: not refitted
    torch.testing.assert_close(
        resumed.inference(later, batch(2)).data["rewards"], whole.inference(later, batch(2)).data["rewards"]
    )
