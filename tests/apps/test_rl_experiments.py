"""Every RL experiment on the embedded arithmetic task, 2 steps each: the reference answers reach
the math checker (``dataset.metadata_keys=[answer]``; without them ``math_answer`` stops the run),
held-out rollouts are evaluated during training (``exp_ctrl.eval_freq_steps``), samples a person can
read land in ``samples.jsonl``, and the summary holds the held-out accuracy before and after. One
fileroot, so the SFT phase runs once."""

import json
import os

import pytest
from device_discipline import OVERRIDES

from realrl.apps.configs import build_config
from realrl.apps.run import run_quickstart

SHORT = [
    "exp_ctrl.total_train_steps=2",
    "dataset.train_bs_n_seqs=4",
    "toy_eval_prompts=16",
    "exp_ctrl.eval_freq_steps=1",  # held-out rollouts after every step
    "eval_prompts=4",
    'prerequisite_overrides=["exp_ctrl.total_train_steps=2","dataset.train_bs_n_seqs=8"]',
]


@pytest.fixture(scope="module")
def fileroot(tmp_path_factory):
    return str(tmp_path_factory.mktemp("arith"))


@pytest.mark.parametrize("name", ["ppo", "grpo", "rloo", "reinforce_pp", "remax"])
def test_rl_experiment_on_the_arithmetic_task(fileroot, name):
    # under the device-discipline check (tests/device_discipline.py), as the other experiments
    cfg = build_config(name, ["task=arith", f"fileroot={fileroot}", *SHORT, *OVERRIDES])
    assert cfg.dataset.metadata_keys == ["answer"] and cfg.reward_fn == "math_answer"
    summary = run_quickstart(name, cfg)
    assert 0.0 <= summary["sft_accuracy"] <= 1.0 and 0.0 <= summary["accuracy"] <= 1.0
    assert summary["accuracy_gain_points"] == pytest.approx(
        100 * (summary["accuracy"] - summary["sft_accuracy"])
    )
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in records:  # the evaluation during training: 4 held-out prompts, every step
        assert r["eval/n_prompts"] == 4.0 and 0.0 <= r["eval/task_reward"] <= 1.0
        assert r["eval/response_length"] > 0 and "eval/ref_kl" in r
    assert summary["eval/task_reward"] == records[-1]["eval/task_reward"]
    with open(os.path.join(cfg.run_dir, "samples.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert [x["step"] for x in lines] == [1, 2]
    for example in lines[-1]["samples"]:
        assert example["prompt"].endswith("=?")  # decoded text, not token ids
        assert isinstance(example["completion"], str) and example["reward"] in (0.0, 1.0)
    assert summary["samples"] and all("=?" in s["prompt"] for s in summary["samples"])
