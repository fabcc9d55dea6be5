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
    with open(os.path.join(fileroot, "ppo", f"toy-seed{seed}", "summary.json")) as f:
        summary = json.load(f)
    return {"seed": seed, "wall_s": wall, "peak_rss_gb": peak / 2**30, **summary}


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


if __name__ == "__main__":
    main()
