"""The realrl side of ``bench_vs_trl.py``: the ``rw`` and ``grpo`` quickstart experiments built
in-process from override strings and launched with ``run_experiment`` (master + worker processes)."""

from __future__ import annotations

import dataclasses
import os
import time

from _trl_common import TRIAL, BenchSpec, summarize_steps


def _threads() -> list[str]:
    """The parent's ``--threads`` (OMP_NUM_THREADS) as realrl's per-worker ``torch_threads``, where
    realrl has that option (else the workers inherit the environment variable)."""
    from realrl.api.quickstart.base import CommonExperimentConfig

    n = os.environ.get("OMP_NUM_THREADS")
    has = "torch_threads" in {f.name for f in dataclasses.fields(CommonExperimentConfig)}
    return [f"torch_threads={n}"] if n and has else []


def _common(spec: BenchSpec, steps: int) -> list[str]:
    return _threads() + [
        f"fileroot={spec.fileroot}",
        f"seed={spec.seed}",
        f"trial_name={TRIAL}",
        "device=cpu",
        "mode=local",
        f"exp_ctrl.total_train_steps={steps}",
        "exp_ctrl.total_train_epochs=100",
        f"allocation_mode=d{spec.workers}",
    ]


def _optimizer(prefix: str, spec: BenchSpec, lr: float) -> list[str]:
    return [
        f"{prefix}.optimizer.lr={lr}",
        f"{prefix}.optimizer.lr_scheduler_type=constant",
        f"{prefix}.optimizer.warmup_steps_proportion=0.0",
        f"{prefix}.optimizer.betas=[0.9,{spec.beta2}]",
        f"{prefix}.optimizer.eps={spec.adam_eps}",
        f"{prefix}.optimizer.grad_clip={spec.grad_clip}",
        f"{prefix}.optimizer.weight_decay=0.0",
        f"{prefix}.engine.dtype=fp32",
        *(_compiled(prefix, spec) if spec.compile else []),
    ]


def _compiled(prefix: str, spec: BenchSpec) -> list[str]:
    cache = os.path.join(spec.bench_dir, ".inductor_cache")
    return [f"{prefix}.engine.compile=on", f"{prefix}.engine.compile_cache_dir={cache}"]


def rw_overrides(spec: BenchSpec, paths: dict[str, str]) -> list[str]:
    return (
        _common(spec, spec.rw_steps)
        + _optimizer("model", spec, spec.rw_lr)
        + [
            f"model.path={paths['init_rm']}",
            f"dataset.train_bs_n_seqs={spec.rw_pairs}",  # one sample = one prompt's single pair
            f"dataset.max_seqlen={spec.max_seqlen}",
            "dataset.max_pairs_per_prompt=1",
        ]
    )


def grpo_overrides(spec: BenchSpec, paths: dict[str, str]) -> list[str]:
    return (
        _common(spec, spec.grpo_steps)
        + _optimizer("actor", spec, spec.grpo_lr)
        + [
            f"actor.path={paths['init_lm']}",
            "ref.engine.dtype=fp32",
            f"dataset.train_bs_n_seqs={spec.grpo_prompts}",  # one sample = one prompt (x n answers)
            f"dataset.max_prompt_len={spec.max_prompt_len}",
            "reward_fn=toy_sentiment",
            # registers "toy_sentiment" in the workers also where realrl.impl does not (before 9f6d952)
            "import_modules=[realrl.impl.dataset.toy]",
            f"ppo.gen.n={spec.grpo_n}",
            f"ppo.gen.max_new_tokens={spec.max_new_tokens}",
            "ppo.gen.top_p=1.0",
            "ppo.gen.top_k=0",
            "ppo.gen.temperature=1.0",
            f"ppo.ppo_n_epochs={spec.ppo_epochs}",
            f"ppo.ppo_n_minibatches={spec.ppo_minibatches}",
            f"ppo.kl_loss_coef={spec.kl_coef}",
            "ppo.early_stop_imp_ratio=null",  # TRL has no early stop
        ]
    )


def run(task: str, spec: BenchSpec, paths: dict[str, str], standby=None) -> dict:
    """Train, time each step (from the master's per-step timestamps) and save the final model;
    ``standby``: warmed-up worker processes (``realrl.system.standby``), as the CLI starts them."""
    from realrl.apps.configs import build_config
    from realrl.apps.main import run_experiment
    from realrl.experiments.tasks import final_checkpoint

    overrides = rw_overrides(spec, paths) if task == "rw" else grpo_overrides(spec, paths)
    cfg = build_config(task, overrides)
    exp = cfg.initial_setup()
    start = time.time()
    records = run_experiment(exp, mode="local", standby=standby)
    wall = time.time() - start
    role = "default" if task == "rw" else "actor"
    out = summarize_steps([r["time"] for r in records], start)
    out.update(
        {
            "train_wall_s": wall,
            "checkpoint": final_checkpoint(cfg.fileroot, cfg.experiment_name, cfg.trial_name, role),
            "mfc_seconds": _mean_timings(records[1:] or records),
            # the one-off compilation (the calls that compiled; 0 when nothing is compiled)
            "compile_s": max(
                (v for k, v in records[-1].items() if k.endswith("compile/seconds")), default=0.0
            ),
            "torch_threads": exp.torch_threads,
            "last": {k: v for k, v in records[-1].items() if isinstance(v, float)},
            "records": records,
        }
    )
    return out


def _mean_timings(records: list[dict]) -> dict[str, float]:
    names = records[0]["timing"].keys()
    return {n: sum(r["timing"][n] for r in records) / len(records) for n in names}
