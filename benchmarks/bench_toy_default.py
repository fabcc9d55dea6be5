"""The main job's figures: the whole default ``ppo`` (toy data, SFT, reward model, PPO, evaluation)
from an empty fileroot, once per seed, with its wall time and the peak memory of its whole
process tree (the launcher plus every worker, sampled every 0.2 s).

    python benchmarks/bench_toy_default.py --seeds 1 2 3
    python benchmarks/bench_toy_default.py --smoke   # seed 1, every phase shortened to 2 steps of 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import psutil
from _smoke import SHORT_RUN, parse_args


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def run_default(seed: int, fileroot: str, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "realrl.apps.quickstart",
        "ppo",
        f"fileroot={fileroot}",
        f"seed={seed}",
        *extra,
    ]
    os.makedirs(fileroot, exist_ok=True)
    log_path = os.path.join(fileroot, f"seed{seed}.log")
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        ps = psutil.Process(proc.pid)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(ps))
            time.sleep(0.2)
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed} failed (exit {proc.returncode}); see {log_path}")
    run_dir = os.path.join(fileroot, "ppo", f"toy-seed{seed}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return {"seed": seed, "wall_s": wall, "peak_rss_gb": peak / 2**30, **summary, **ppo_step_times(run_dir)}


def ppo_step_times(run_dir: str) -> dict:
    """The PPO phase's mean step time and each call's mean time per step (the steps after the
    first, which pays for first-use costs), from its ``stats.jsonl``."""
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "timing" in r]
    later = rows[1:] or rows
    step = [(b["time"] - a["time"]) for a, b in zip(rows, rows[1:])]
    calls = {k: sum(r["timing"][k] for r in later) / len(later) for k in later[0]["timing"]}
    return {"ppo_step_s": sum(step) / max(len(step), 1), "ppo_call_s": calls}


def time_table(rows: list[dict]) -> str:
    """Where the main job's time goes: before the first phase (the command line's start-up and the
    task's data), each phase (its workers' start-up, setup and steps), the plots, the evaluation
    (from its request, the plots drawn meanwhile); then the PPO phase's step and each call's time."""
    # summary.json sorts its keys: put the phases back in the order they ran
    order = ("sft", "rw", "ppo", "plots", "evaluation")
    phases = sorted(rows[0]["phase_seconds"], key=lambda p: order.index(p) if p in order else len(order))
    lines = ["| seed | before the first phase | " + " | ".join(phases) + " | wall |"]
    lines.append("|---" * (len(phases) + 3) + "|")
    for r in rows:
        before = r["wall_s"] - sum(r["phase_seconds"].values())
        cells = " | ".join(f"{r['phase_seconds'][p]:.1f} s" for p in phases)
        lines.append(f"| {r['seed']} | {before:.1f} s | {cells} | {r['wall_s']:.1f} s |")
    calls = list(rows[0]["ppo_call_s"])
    lines += ["", "| seed | PPO step | " + " | ".join(calls) + " |", "|---" * (len(calls) + 2) + "|"]
    for r in rows:
        cells = " | ".join(f"{r['ppo_call_s'][c] * 1000:.0f} ms" for c in calls)
        lines.append(f"| {r['seed']} | {r['ppo_step_s'] * 1000:.0f} ms | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--fileroot", default=None, help="default: a fresh temporary folder per seed")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for the ppo command")
    args = parse_args(parser, argv, seeds=[1])
    if args.smoke:
        args.extra = [*SHORT_RUN, *args.extra]
    rows = []
    for seed in args.seeds:
        root = args.fileroot or tempfile.mkdtemp(prefix=f"realrl-toy-seed{seed}-")
        rows.append(run_default(seed, root, args.extra))
        r = rows[-1]
        print(
            f"seed {seed}: rm_accuracy {r['rm_accuracy']:.3f}  sft {r['sft_true_reward_mean']:.2f} ± "
            f"{r['sft_true_reward_std']:.2f}  ppo {r['true_reward_mean']:.2f} ± {r['true_reward_std']:.2f}  "
            f"gain {r['gain_in_sft_std']:.2f} SFT std  kl {r['kl']:.2f}  wall {r['wall_s']:.0f} s  "
            f"peak RSS {r['peak_rss_gb']:.2f} GB  (load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    print(
        "\n| seed | RM held-out accuracy | SFT true reward | PPO true reward | gain (SFT std) | KL (nats) | wall | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['rm_accuracy']:.3f} | {r['sft_true_reward_mean']:.2f} ± {r['sft_true_reward_std']:.2f} "
            f"| {r['true_reward_mean']:.2f} ± {r['true_reward_std']:.2f} | {r['gain_in_sft_std']:.2f} | {r['kl']:.2f} "
            f"| {r['wall_s'] / 60:.1f} min | {r['peak_rss_gb']:.2f} GB |"
        )
    print("\n" + time_table(rows))


if __name__ == "__main__":
    main()
