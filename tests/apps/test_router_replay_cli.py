"""``ppo.router_replay`` from the command line: refused for the dense toy actor, or an actor in
pipeline stages, before anything runs (one line, exit 2), accepted for the Mixture-of-Experts one (``task=sentiment_moe``), whose
train steps then recompute the decoder's log-probs through the replayed experts."""

import json
import subprocess
import sys

import pytest


def grpo(fileroot, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "realrl.apps.quickstart", "grpo", f"fileroot={fileroot}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(
    "extra, why",
    [
        ((), "is a dense model"),
        (("task=sentiment_moe", 'allocation_mode="actor_train:d1m1p2,*:d1m1p1"'), "pipeline stages (d1m1p2)"),
    ],
)
def test_what_cannot_replay_is_refused_in_one_line(tmp_path, extra, why):
    """The dense toy actor, and a Mixture-of-Experts one in pipeline stages."""
    done = grpo(tmp_path, "ppo.router_replay=true", *extra)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "ppo.router_replay=true" in lines[0] and why in lines[0], lines
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "sft").exists()  # refused before the SFT phase it builds on


@pytest.mark.slow  # an SFT and a GRPO phase of two steps each, and their evaluation: minutes
def test_a_moe_actor_trains_with_replayed_experts(tmp_path):
    steps = ["exp_ctrl.total_train_steps=2", "dataset.train_bs_n_seqs=8"]
    done = grpo(
        tmp_path,
        "task=sentiment_moe",
        *steps,
        f"prerequisite_overrides={json.dumps(steps)}",
        "toy_eval_prompts=16",
        "ppo.router_replay=true",
        "ppo.recompute_logprobs=true",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "grpo" / "toy_moe-seed1" / "stats.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 2
    for r in rows:  # the same experts, fp32 on the CPU: the decoder's log-probs up to rounding
        assert r["actor_train/rollout_corr/log_ratio_abs_max"] < 1e-4, r
        assert 0 < r["actor_train/moe_load_min"] <= r["actor_train/moe_load_max"] < 1, r
