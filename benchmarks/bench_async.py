"""Asynchronous RL against the synchronous layouts on 2 model workers: the toy PPO from the command
line per seed, side by side.

Layouts and modes:
  sync d2                 both workers data-parallel for every call (the synchronous default's best)
  sync split              generation on worker 1, everything else on worker 0, synchronous
  async eta=1|2|4         the split layout with generation up to eta steps ahead (decoupled loss)
  async eta=..., std loss the same with the standard PPO loss (AReaL's ablation)

Reported per row (mean ± sd over seeds): training samples per second over the RL phase
(answers trained on / the RL phase's own seconds), the RL phase's seconds, the trained policy's
gain over the SFT policy in SFT standard deviations, the KL to the reference, the largest
staleness seen, and the policy's weights sent to the generation worker per step (bytes and
seconds moving: the ``realloc/actor/*`` statistics). The SFT and reward phases run once per seed and are shared.

    python benchmarks/bench_async.py [--seeds 1 2 3] [--etas 1 2 4] [--algo ppo|grpo]
    python benchmarks/bench_async.py --smoke    # seed 1, sync d2 and async eta=1 only, 2-step runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _smoke import SHORT_RUN, parse_args

from realrl.apps.main import SAVED_CONFIG, load_config

SPLIT = 'allocation_mode="actor_gen:d1m1p1@1,*:d1m1p1"'


def rows(etas: list[int], ablation: bool) -> list[tuple[str, list[str]]]:
    out = [("sync d2", ["allocation_mode=d2"]), ("sync split", [SPLIT])]
    for eta in etas:
        mode = [SPLIT, "async_rl.enabled=true", f"async_rl.max_staleness={eta}"]
        out.append((f"async eta={eta}", mode))
        if ablation:
            out.append((f"async eta={eta}, std loss", [*mode, "ppo.decoupled_loss=false"]))
    return out


def run(algo: str, label: str, overrides: list[str], seed: int, fileroot: str, smoke: bool) -> dict:
    name = f"{algo}-" + label.replace(" ", "_").replace("=", "").replace(",", "")
    cmd = [sys.executable, "-m", "realrl.apps.quickstart", algo, f"fileroot={fileroot}", f"seed={seed}"]
    cmd += [f"experiment_name={name}", *overrides, *(SHORT_RUN if smoke else ())]
    with open(os.path.join(fileroot, f"{name}-seed{seed}.log"), "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(
            f"{name} seed {seed} failed (exit {proc.returncode}); see {fileroot}/{name}-seed{seed}.log"
        )
    run_dir = os.path.join(fileroot, name, f"toy-seed{seed}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    exp = load_config(os.path.join(run_dir, SAVED_CONFIG))  # the samples each step trains on
    trained = next(m.n_seqs for m in exp.mfcs if m.name == "actor_train") * len(records)
    wall = summary["phase_seconds"][algo]  # the RL phase alone: its workers' start to their exit
    return {
        "samples_per_s": trained / wall,
        "wall": wall,
        "gain": summary["gain_in_sft_std"],
        "kl": summary["kl"],
        "staleness": max((r.get("async/staleness_max", 0.0) for r in records), default=0.0),
        # the policy's weights sent to the generation worker: per step, bytes and seconds moving
        "weights_mb": sum(r.get("realloc/actor/bytes", 0.0) for r in records) / len(records) / 2**20,
        "weights_ms": 1000 * sum(r.get("realloc/actor/seconds", 0.0) for r in records) / len(records),
    }


def mean_sd(xs: list[float], fmt: str = "{:.2f}") -> str:
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(statistics.mean(xs))} ± {fmt.format(statistics.stdev(xs))}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="ppo", choices=["ppo", "grpo"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--etas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--no-ablation", action="store_true", help="skip the standard-loss rows")
    p.add_argument("--only", nargs="+", help="run only these rows (labels as printed)")
    p.add_argument("--fileroot", default="outputs/bench_async")
    args = parse_args(p, None, seeds=[1], etas=[1], no_ablation=True, only=["sync d2", "async eta=1"])
    os.makedirs(args.fileroot, exist_ok=True)
    table = [
        (label, o)
        for label, o in rows(args.etas, not args.no_ablation)
        if not args.only or label in args.only
    ]
    results: dict[str, list[dict]] = {label: [] for label, _ in table}
    for seed in args.seeds:
        for label, overrides in table:
            results[label].append(run(args.algo, label, overrides, seed, args.fileroot, args.smoke))
    base_label = table[0][0]
    base = statistics.mean(r["samples_per_s"] for r in results[base_label])
    print(f"{args.algo} on the sentiment task, 2 model workers, seeds {args.seeds}")
    print(
        f"| run | samples/s | vs {base_label} | RL phase s | gain (SFT std) | KL | max staleness "
        "| weights moved per step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, runs in results.items():
        rate = [r["samples_per_s"] for r in runs]
        mb, ms = (
            statistics.mean(r["weights_mb"] for r in runs),
            statistics.mean(r["weights_ms"] for r in runs),
        )
        print(
            f"| {label} | {mean_sd(rate)} | {statistics.mean(rate) / base:.2f}x | {mean_sd([r['wall'] for r in runs], '{:.1f}')} "
            f"| {mean_sd([r['gain'] for r in runs])} | {mean_sd([r['kl'] for r in runs])} "
            f"| {max(r['staleness'] for r in runs):.0f} | {mb:.2f} MB in {ms:.1f} ms |"
        )


if __name__ == "__main__":
    main()
