"""bf16 engines end to end on the CPU: every matmul and attention of every model worker runs in
bf16 (tests/compute_dtype.py), over every layout the default suite runs in fp32 (one worker,
tensor parallel, data parallel with FSDP, pipeline stages, per-call layouts with reallocation) and
over asynchronous generation with an environment's multi-turn rollouts, under the device and
NCCL-rules checks as every end-to-end run. An engine that computed in fp32 where its option says
bf16 (twice the memory on a GPU, or a dtype clash between pipeline stages) stops its run."""

import json
import math
import os

import compute_dtype
from device_discipline import OVERRIDES as DEVICE_OVERRIDES
from test_experiments_e2e import PPO_EXTRA, assert_checked, assert_run_outputs

from realrl.apps.configs import build_config
from realrl.apps.run import run_quickstart

STEPS = ["exp_ctrl.total_train_steps=2", "dataset.train_bs_n_seqs=8"]
PREREQUISITES = ["exp_ctrl.total_train_steps=2", "dataset.train_bs_n_seqs=8"]
_CHECK = os.path.abspath(compute_dtype.__file__)
# the device and NCCL-rules checks' options with this check's file beside theirs
CHECKS = (
    DEVICE_OVERRIDES[0],
    DEVICE_OVERRIDES[1].replace('"]', f'","{_CHECK}"]'),
)


def run_bf16(monkeypatch, name, fileroot, roles, *extra):
    monkeypatch.setenv(compute_dtype.ENV, "bf16")
    options = [f"fileroot={fileroot}", *STEPS, *CHECKS, *extra]
    cfg = build_config(name, options + compute_dtype.engine_overrides(roles, "bf16", PREREQUISITES))
    summary = run_quickstart(name, cfg)
    assert_checked(cfg.run_dir)
    assert compute_dtype.assert_computed_in(cfg.run_dir, "bf16") > 0
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return cfg, summary, records


def test_ppo_in_bf16_over_tensor_data_fsdp_pipeline_and_per_call_layouts(monkeypatch, toy_fileroot):
    """One run, two workers: the actor trains tensor-parallel and generates as two data-parallel
    replicas (its weights move before every generation), the critic trains sharded by FSDP, the
    reference model runs as two pipeline stages, the reward model whole on one worker."""
    layout = 'allocation_mode="actor_train:d1m2p1,actor_gen:d2m1p1,critic:d2m1p1,ref:d1m1p2,*:d1m1p1"'
    cfg, summary, records = run_bf16(
        monkeypatch,
        "ppo",
        toy_fileroot,
        ("actor", "critic", "ref", "rew"),
        *PPO_EXTRA,
        layout,
        "critic.engine.fsdp=true",
        "trial_name=bf16-layouts",
    )
    assert_run_outputs(cfg.run_dir)
    assert cfg.actor.engine.dtype == cfg.critic.engine.dtype == "bf16"
    for r in records:
        assert r["realloc/actor/moves"] == "d1m2p1@0,1 -> d2m1p1@0,1"
        for key in ("actor_train/loss", "critic_train/critic_loss", "compute_adv/task_reward"):
            assert math.isfinite(r[key]), (r["step"], key)
    assert math.isfinite(summary["actor_train/loss"])


def test_grpo_in_bf16_generates_ahead_with_an_environment(monkeypatch, arith_fileroot):
    """Asynchronous GRPO on the arithmetic task, generation on a worker of its own (the weights
    pushed to it), rollouts of up to two turns with an environment."""
    env = ["task=arith", "env=examples/envs/retry.py:Retry", "reward_fn=null", "ppo.max_turns=2"]
    cfg, _, records = run_bf16(
        monkeypatch,
        "grpo",
        arith_fileroot,
        ("actor", "ref"),
        *env,
        'allocation_mode="actor_gen:d1m1p1@1,*:d1m1p1"',
        "async_rl.enabled=true",
        "toy_eval_prompts=0",
        "eval_prompts=4",
        "trial_name=bf16-async-env",
    )
    assert [r["async/staleness_max"] for r in records][0] == 0.0
    for r in records:
        assert 1.0 <= r["actor_gen/turns_mean"] <= 2.0 and math.isfinite(r["actor_train/loss"])
