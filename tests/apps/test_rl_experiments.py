"""Every RL experiment on the embedded arithmetic task, 2 steps each: the reference answers reach
the math checker (``dataset.metadata_keys=[answer]``; without them ``math_answer`` stops the run),
samples a person can read land in ``samples.jsonl``, and the summary holds the held-out accuracy
before and after. One fileroot, so the SFT phase runs once."""

import json
import os

import pytest

from realrl.apps.configs import build_config
from realrl.apps.run import run_quickstart

SHORT = [
    "exp_ctrl.total_train_steps=2",
    "dataset.train_bs_n_seqs=4",
    "toy_eval_prompts=16",
    'prerequisite_overrides=["exp_ctrl.total_train_steps=2","dataset.train_bs_n_seqs=8"]',
]


@pytest.fixture(scope="module")
def fileroot(tmp_path_factory):
    return str(tmp_path_factory.mktemp("arith"))


@pytest.mark.parametrize("name", ["ppo", "grpo", "rloo", "reinforce_pp", "remax"])
def test_rl_experiment_on_the_arithmetic_task(fileroot, name):
    cfg = build_config(name, ["task=arith", f"fileroot={fileroot}", *SHORT])
    assert cfg.dataset.metadata_keys == ["answer"] and cfg.reward_fn == "math_answer"
    summary = run_quickstart(name, cfg)
    assert 0.0 <= summary["sft_accuracy"] <= 1.0 and 0.0 <= summary["accuracy"] <= 1.0
    assert summary["accuracy_gain_points"] == pytest.approx(
        100 * (summary["accuracy"] - summary["sft_accuracy"])
    )
    with open(os.path.join(cfg.run_dir, "samples.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert [x["step"] for x in lines] == [1, 2]
    for example in lines[-1]["samples"]:
        assert example["prompt"].endswith("=?")  # decoded text, not token ids
        assert isinstance(example["completion"], str) and example["reward"] in (0.0, 1.0)
    assert summary["samples"] and all("=?" in s["prompt"] for s in summary["samples"])
