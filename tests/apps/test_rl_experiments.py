"""Every RL experiment on the embedded arithmetic task, 2 steps each: the reference answers reach
the math checker (``dataset.metadata_keys=[answer]``; without them ``math_answer`` stops the run),
held-out rollouts are evaluated during training (``exp_ctrl.eval_freq_steps``), samples a person can
read land in ``samples.jsonl``, and the summary holds the held-out accuracy before and after. One
fileroot, so the SFT phase runs once."""

import json
import os

import collective_rules
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


@pytest.fixture(scope="session")
def fileroot(arith_fileroot):
    return arith_fileroot


@pytest.mark.parametrize(
    "name",
    [
        "ppo",
        "grpo",
        # the critic-free relatives differ from grpo in their estimator only (unit-tested)
        pytest.param("rloo", marks=pytest.mark.slow),
        pytest.param("reinforce_pp", marks=pytest.mark.slow),
        "remax",  # a second generate and reward call: the graph differs
    ],
)
def test_rl_experiment_on_the_arithmetic_task(fileroot, name):
    # under the device-discipline check (tests/device_discipline.py), as the other experiments
    cfg = build_config(name, ["task=arith", f"fileroot={fileroot}", *SHORT, *OVERRIDES])
    assert cfg.dataset.metadata_keys == ["answer"] and cfg.reward_fn == "math_answer"
    summary = run_quickstart(name, cfg)
    collective_rules.check_run(cfg.run_dir)  # and NCCL's rules (tests/collective_rules.py)
    assert 0.0 <= summary["sft_accuracy"] <= 1.0 and 0.0 <= summary["accuracy"] <= 1.0
    assert summary["accuracy_gain_points"] == pytest.approx(
        100 * (summary["accuracy"] - summary["sft_accuracy"])
    )
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in records:  # the evaluation during training: 4 held-out prompts, every step
        assert r["eval/n_prompts"] == 4.0 and 0.0 <= r["eval/task_reward"] <= 1.0
        assert r["eval/response_length"] > 0
        assert ("eval/ref_kl" in r) == cfg.ppo.uses_reference  # where a KL term reads the reference
    assert summary["eval/task_reward"] == records[-1]["eval/task_reward"]
    with open(os.path.join(cfg.run_dir, "samples.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert [x["step"] for x in lines] == [1, 2]
    for example in lines[-1]["samples"]:
        assert example["prompt"].endswith("=?")  # decoded text, not token ids
        assert isinstance(example["completion"], str) and example["reward"] in (0.0, 1.0)
    assert summary["samples"] and all("=?" in s["prompt"] for s in summary["samples"])


# the environment and agent runs read their statistics, not the summary's held-out figures
ENV = ["env=examples/envs/retry.py:Retry", "reward_fn=null", "ppo.max_turns=2", "toy_eval_prompts=0"]


def run_with_env(fileroot, *extra):
    cfg = build_config("grpo", ["task=arith", f"fileroot={fileroot}", *SHORT, *OVERRIDES, *ENV, *extra])
    summary = run_quickstart("grpo", cfg)
    collective_rules.check_run(cfg.run_dir)
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        return cfg, summary, [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def env_run(fileroot):
    return run_with_env(fileroot, "trial_name=env")


def test_grpo_takes_turns_with_an_environment_and_trains_on_whole_trajectories(env_run):
    """The arithmetic task with an environment that lets a wrong answer try again: the
    environment's reward alone (no reward call), trajectories of up to two turns, evaluated on
    held-out prompts, each turn marked in samples.jsonl."""
    cfg, summary, records = env_run
    assert cfg.reward_fn is None and "rew_inf" not in {m.name for m in cfg.initial_setup().mfcs}
    for r in records:
        assert 1.0 <= r["actor_gen/turns_mean"] <= 2.0 and r["actor_gen/turns_max"] <= 2.0
        assert r["compute_adv/task_reward"] == pytest.approx(r["actor_gen/env_reward_mean"], abs=1e-6)
        assert 0.0 <= r["eval/task_reward"] <= 1.0 and r["actor_gen/tokens_per_turn"] > 0
    with open(os.path.join(cfg.run_dir, "samples.jsonl")) as f:
        examples = [e for line in f for e in json.loads(line)["samples"]]
    retried = [e for e in examples if "turns" in e]
    assert retried, "no trajectory took a second turn"
    for e in retried:
        assert [next(iter(t)) for t in e["turns"]] == ["model", "env", "model"]
        assert e["turns"][1]["env"] == "=?"


@pytest.mark.slow  # tests/parallel/test_multi_turn_ranks.py checks the pair's shared steps in the default suite
def test_multi_turn_rollouts_do_not_depend_on_the_tensor_parallel_layout(fileroot, env_run):
    """Trajectories are sampled keyed by (sample, answer, turn) and a tensor-parallel pair steps its
    environments once: with the actor split over two workers the run's statistics are the same.
    (Data-parallel ranks load different prompts; tests/parallel/test_multi_turn_ranks.py checks
    that FSDP ranks turn in lockstep and sample what one worker samples.)"""
    *_, base = env_run
    *_, other = run_with_env(fileroot, 'allocation_mode="actor:d1m2p1,*:d1m1p1"', "trial_name=env-tp")
    for b, o in zip(base, other, strict=True):
        for key in ("actor_gen/turns_mean", "actor_gen/env_reward_mean", "compute_adv/response_length"):
            assert o[key] == pytest.approx(b[key], rel=1e-6), key
        assert o["actor_train/loss"] == pytest.approx(b["actor_train/loss"], rel=1e-3, abs=1e-5)


def test_an_agent_written_for_the_openai_api_trains_through_the_chat_endpoint(fileroot):
    """examples/agents/retry_agent.py: the same retry task as the environment's, driven by agent
    code that calls chat.completions; its reward alone, its completions chained into one
    trajectory of up to two model turns."""
    agent = [
        "agent=examples/agents/retry_agent.py:run",
        "reward_fn=null",
        "trial_name=agent",
        "toy_eval_prompts=0",
    ]
    cfg = build_config("grpo", ["task=arith", f"fileroot={fileroot}", *SHORT, *OVERRIDES, *agent])
    run_quickstart("grpo", cfg)
    collective_rules.check_run(cfg.run_dir)
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        assert 1.0 <= r["actor_gen/agent/completions_mean"] <= 2.0
        assert r["actor_gen/agent/unchained_completions"] == 0.0  # every follow-up extends its chain
        assert r["compute_adv/task_reward"] == pytest.approx(r["actor_gen/env_reward_mean"], abs=1e-6)
    with open(os.path.join(cfg.run_dir, "samples.jsonl")) as f:
        examples = [e for line in f for e in json.loads(line)["samples"]]
    assert any([next(iter(t)) for t in e.get("turns", [])] == ["model", "env", "model"] for e in examples)
