"""On-policy distillation against RL on the toy sentiment task, per seed: a teacher 4x the
student's size trained by GRPO (``opd_teacher``, from its own SFT), then the default student
(the toy SFT model) distilled from it (``opd``) and, as the baseline, trained by GRPO itself
(``grpo``) for as many steps. Prints the held-out true reward of the teacher, of the student
before (SFT) and after each, the steps each took, the student's exact reverse KL to the teacher,
and the first distillation step whose batch reward reached the student GRPO run's final one.

    python benchmarks/bench_opd.py --seeds 1 2 3     # the recipes' sizes: 30 steps each
    python benchmarks/bench_opd.py --smoke           # seed 1, 2 steps, tiny batches

Every run is ``python -m realrl.apps.quickstart <experiment> seed=<s>`` in one fileroot, so the SFT
and teacher phases run once per seed and later runs reuse them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _smoke import SHORT_RUN, parse_args

REWARD = "compute_adv/task_reward"  # the training batch's true reward, every step


def quickstart(experiment: str, seed: int, fileroot: str, extra: list[str]) -> dict:
    """Run one experiment; its summary, its per-step batch rewards and its wall seconds."""
    cmd = [sys.executable, "-m", "realrl.apps.quickstart", experiment, f"fileroot={fileroot}", f"seed={seed}"]
    start = time.time()
    with open(os.path.join(fileroot, f"{experiment}-seed{seed}.log"), "w") as log:
        proc = subprocess.run([*cmd, *extra], stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{experiment} seed {seed} failed (exit {proc.returncode}); see {log.name}")
    run_dir = os.path.join(fileroot, experiment, f"toy-seed{seed}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return {**summary, "rewards": batch_rewards(run_dir), "wall_s": time.time() - start}


def batch_rewards(run_dir: str) -> list[float]:
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        return [r[REWARD] for r in map(json.loads, filter(str.strip, f)) if REWARD in r]


def parameters(checkpoint: str) -> int:
    """A dense llama-shaped decoder's parameter count, from its config.json."""
    with open(os.path.join(checkpoint, "config.json")) as f:
        c = json.load(f)
    h, inner, v, kv = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_key_value_heads"]
    head_dim = h // c["num_attention_heads"]
    attn = 2 * h * h + 2 * h * kv * head_dim
    return c["num_hidden_layers"] * (attn + 3 * h * inner + 2 * h) + 2 * v * h + h


def first_step_reaching(rewards: list[float], target: float) -> int | None:
    return next((i + 1 for i, r in enumerate(rewards) if r >= target), None)


def one_seed(seed: int, fileroot: str, extra: list[str]) -> dict:
    opd = quickstart("opd", seed, fileroot, extra)  # builds SFT, the teacher's SFT and its GRPO first
    grpo = quickstart("grpo", seed, fileroot, extra)  # the student's own RL, from the same SFT model
    teacher_dir = os.path.join(fileroot, "opd_teacher", f"toy-seed{seed}")
    teacher_ckpt = os.path.join(teacher_dir, "checkpoints", "actor", "final")
    student_ckpt = os.path.join(fileroot, "sft", f"toy-seed{seed}", "checkpoints", "default", "final")
    grpo_final = statistics.mean(grpo["rewards"][-5:])  # the last steps' batch reward
    return {
        "seed": seed,
        "teacher_params": parameters(teacher_ckpt),
        "student_params": parameters(student_ckpt),
        "teacher_rl_steps": len(batch_rewards(teacher_dir)),
        "teacher_reward": opd["teacher_true_reward_mean"],
        "sft_reward": opd["sft_true_reward_mean"],
        "grpo_reward": grpo["true_reward_mean"],
        "grpo_steps": grpo["steps"],
        "opd_reward": opd["true_reward_mean"],
        "opd_steps": opd["steps"],
        "kl_before": opd["sft_kl_to_teacher"],
        "kl_after": opd["kl_to_teacher"],
        "opd_steps_to_grpo_final": first_step_reaching(opd["rewards"], grpo_final),
        "grpo_steps_to_grpo_final": first_step_reaching(grpo["rewards"], grpo_final),
        "phase_seconds": opd["phase_seconds"],
        "grpo_seconds": grpo["phase_seconds"].get("grpo"),
    }


def fmt(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--fileroot", default=None, help="default: a fresh temporary folder")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    args = parse_args(parser, argv, seeds=[1])
    if args.smoke:
        args.extra = [*SHORT_RUN, *args.extra]
    fileroot = args.fileroot or tempfile.mkdtemp(prefix="realrl-bench-opd-")
    os.makedirs(fileroot, exist_ok=True)
    rows = []
    for seed in args.seeds:
        rows.append(one_seed(seed, fileroot, args.extra))
        print(json.dumps(rows[-1]), flush=True)
    print("\nheld-out true reward (800 prompts unless --smoke); steps: training steps of each run")
    print(
        "| seed | teacher (params) | teacher reward | teacher RL steps | student SFT | student GRPO "
        "(steps) | student OPD (steps) | OPD / GRPO gain | reverse KL to teacher, before -> after | "
        "steps to GRPO's final batch reward: OPD / GRPO |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        grpo_gain, opd_gain = r["grpo_reward"] - r["sft_reward"], r["opd_reward"] - r["sft_reward"]
        ratio = opd_gain / grpo_gain if grpo_gain else None
        cells = [
            r["seed"],
            f"{r['teacher_params'] / 1e3:.0f}k vs {r['student_params'] / 1e3:.0f}k",
            fmt(r["teacher_reward"]),
            r["teacher_rl_steps"],
            fmt(r["sft_reward"]),
            f"{fmt(r['grpo_reward'])} ({r['grpo_steps']})",
            f"{fmt(r['opd_reward'])} ({r['opd_steps']})",
            fmt(ratio),
            f"{fmt(r['kl_before'])} -> {fmt(r['kl_after'])}",
            f"{fmt(r['opd_steps_to_grpo_final'])} / {fmt(r['grpo_steps_to_grpo_final'])}",
        ]
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
