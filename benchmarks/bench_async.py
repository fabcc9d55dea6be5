"""Asynchronous RL against the synchronous layouts on 2 model workers: an RL experiment from the
command line per seed, side by side, on the generation-heavy task by default (answers of 4 to 44
words, one update per batch: ``task=sentiment_long``).

Layouts and modes:
  sync d2                   both workers data-parallel for every call
  sync split                generation on worker 1, every other call on worker 0
  sync balanced             generation and the reference model on worker 1, the rest on worker 0
  async eta=N               the balanced layout, generation up to N steps ahead (decoupled loss)
  async eta=N, std loss     the same with the standard PPO loss (AReaL's ablation)
  async eta=N, partial      the same with partial rollouts (newer weights reach unfinished answers)

Reported per row (mean ± sd over seeds):
  samples/s        training samples per second once running (from the step records' times,
                   after the first third of the steps: worker start-up excluded)
  vs best sync     that rate over the best synchronous row's
  RL phase s       the RL phase's own seconds, start-up included (``phase_seconds``)
  s to 80 %        seconds from the first step until the training reward (5-step mean) first
                   reaches 80 % of the way from sync d2's start to its end, same seed
  held-out reward  the trained policy's true reward on held-out prompts; gain in SFT std
  staleness        the largest ``async/staleness_max``; answers spanning versions (partial rollouts)
  weights / step   the policy moved to the generation worker per step (bytes, seconds)

Then the same comparison on paper for 8 GPUs (generation 6 : training 2 against every call on all
8), from the per-call seconds measured here (docs/async.md says how they are scaled).

    python benchmarks/bench_async.py [--seeds 1 2 3] [--etas 1 2 4] [--task sentiment_long] [--algo grpo]
    python benchmarks/bench_async.py --smoke    # seed 1, sync d2, sync split and async eta=1, 2-step runs
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
BALANCED = 'allocation_mode="actor_gen:d1m1p1@1,ref:d1m1p1@1,*:d1m1p1"'
ASYNC = ("async_rl.enabled=true",)
GEN_CALL = "actor_gen"
TRAIN_CALL = "actor_train"


def rows(etas: list[int], ablation: bool, partial: bool) -> list[tuple[str, list[str]]]:
    out = [("sync d2", ["allocation_mode=d2"]), ("sync split", [SPLIT]), ("sync balanced", [BALANCED])]
    for eta in etas:
        mode = [BALANCED, *ASYNC, f"async_rl.max_staleness={eta}"]
        out.append((f"async eta={eta}", mode))
        if ablation:
            out.append((f"async eta={eta}, std loss", [*mode, "ppo.decoupled_loss=false"]))
        if partial:
            out.append((f"async eta={eta}, partial", [*mode, "async_rl.partial_rollout=true"]))
    return out


def run(
    algo: str, task: str, label: str, overrides: list[str], seed: int, fileroot: str, smoke: bool
) -> dict:
    name = f"{algo}-{task}-" + label.replace(" ", "_").replace("=", "").replace(",", "")
    cmd = [sys.executable, "-m", "realrl.apps.quickstart", algo, f"task={task}", f"fileroot={fileroot}"]
    cmd += [f"seed={seed}", f"experiment_name={name}", *overrides, *(SHORT_RUN if smoke else ())]
    log_path = os.path.join(fileroot, f"{name}-seed{seed}.log")
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed (exit {proc.returncode}); see {log_path}")
    run_dir = next(
        os.path.join(fileroot, name, d)
        for d in os.listdir(os.path.join(fileroot, name))
        if d.endswith(f"-seed{seed}")
    )
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        records = [json.loads(line) for line in f]
    exp = load_config(os.path.join(run_dir, SAVED_CONFIG))  # the answers each step trains on
    train = next(m for m in exp.mfcs if m.name == TRAIN_CALL)
    per_step = train.n_seqs * train.interface_impl.args["ppo"].gen.n
    first = len(records) // 3  # worker start-up and the first calls' warm-up left out
    times = [r["time"] for r in records]
    steady = (times[-1] - times[first]) / max(len(records) - 1 - first, 1) if len(records) > 1 else 0.0
    calls: dict[str, float] = {}
    for r in records[first:]:
        for k, v in r["timing"].items():
            calls[k] = calls.get(k, 0.0) + v / len(records[first:])
    return {
        "samples_per_s": per_step / steady if steady > 0 else 0.0,
        "wall": summary["phase_seconds"][algo],  # the RL phase alone: its workers' start to their exit
        "rewards": [r.get("compute_adv/task_reward", 0.0) for r in records],
        "times": [t - times[0] for t in times],
        "held_out": summary["true_reward_mean"],
        "gain": summary["gain_in_sft_std"],
        "kl": summary["kl"],
        "staleness": max((r.get("async/staleness_max", 0.0) for r in records), default=0.0),
        "spanning": statistics.mean(r.get(f"{GEN_CALL}/answers_spanning_versions", 0.0) for r in records),
        # the policy's weights sent to the generation worker: per step, bytes and seconds moving
        "weights_mb": sum(r.get("realloc/actor/bytes", 0.0) for r in records) / len(records) / 2**20,
        "weights_ms": 1000 * sum(r.get("realloc/actor/seconds", 0.0) for r in records) / len(records),
        "calls": calls,  # mean seconds per step of each call (and reallocation), once running
    }


def mean_sd(xs: list[float], fmt: str = "{:.2f}") -> str:
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(statistics.mean(xs))} ± {fmt.format(statistics.stdev(xs))}"


def time_to_target(run: dict, base: dict, share: float = 0.8) -> float | None:
    """Seconds from the first step until ``run``'s training reward (5-step mean) reaches ``share``
    of the way from ``base``'s first 5 steps to its last 5; None if it never does."""
    start, end = statistics.mean(base["rewards"][:5]), statistics.mean(base["rewards"][-5:])
    if end <= start:
        return None
    target = start + share * (end - start)
    rewards = run["rewards"]
    for i in range(min(4, len(rewards) - 1), len(rewards)):
        if statistics.mean(rewards[max(i - 4, 0) : i + 1]) >= target:
            return run["times"][i]
    return None


def on_paper(results: dict[str, list[dict]], split_label: str, d2_label: str) -> list[str]:
    """8 GPUs, from the per-call seconds measured here: generation time modelled as a + b * answers
    per worker (fitted to sync d2, half the batch per worker, and sync split, all of it on one),
    every other call as perfectly parallel work (its one-worker seconds / workers)."""
    split, d2 = results[split_label], results[d2_label]
    gen_all = statistics.mean(r["calls"].get(GEN_CALL, 0.0) for r in split)
    gen_half = statistics.mean(r["calls"].get(GEN_CALL, 0.0) for r in d2)
    rest = statistics.mean(
        sum(v for k, v in r["calls"].items() if k != GEN_CALL and not k.startswith("realloc")) for r in split
    )
    b = max(2 * (gen_all - gen_half), 0.0)  # seconds per whole batch, spread over workers
    a = max(gen_all - b, 0.0)  # seconds whatever the share: per-token steps, the longest answer
    gen = lambda n: a + b / n  # noqa: E731
    sync8 = gen(8) + rest / 8
    split62 = gen(6) + rest / 2
    async62 = max(gen(6), rest / 2)
    return [
        f"on paper, 8 GPUs (generation a + b/n: a = {a * 1000:.0f} ms, b = {b * 1000:.0f} ms; the other "
        f"calls {rest * 1000:.0f} ms on one worker, divided by the workers):",
        "| layout | s/step | vs sync d8 |",
        "|---|---|---|",
        f"| sync d8 (every call on 8) | {sync8:.3f} | 1.00x |",
        f"| sync 6:2 (generation on 6, the rest on 2) | {split62:.3f} | {sync8 / split62:.2f}x |",
        f"| async 6:2, eta >= 1 | {async62:.3f} | {sync8 / async62:.2f}x |",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="grpo", choices=["ppo", "grpo"])
    p.add_argument("--task", default="sentiment_long", choices=["sentiment", "sentiment_long"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--etas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--no-ablation", action="store_true", help="skip the standard-loss rows")
    p.add_argument("--no-partial", action="store_true", help="skip the partial-rollout rows")
    p.add_argument("--only", nargs="+", help="run only these rows (labels as printed)")
    p.add_argument("--fileroot", default="outputs/bench_async")
    args = parse_args(
        p,
        None,
        seeds=[1],
        etas=[1],
        no_ablation=True,
        no_partial=True,
        only=["sync d2", "sync split", "async eta=1"],
    )
    os.makedirs(args.fileroot, exist_ok=True)
    table = [
        (label, o)
        for label, o in rows(args.etas, not args.no_ablation, not args.no_partial)
        if not args.only or label in args.only
    ]
    results: dict[str, list[dict]] = {label: [] for label, _ in table}
    for seed in args.seeds:
        for label, overrides in table:
            results[label].append(
                run(args.algo, args.task, label, overrides, seed, args.fileroot, args.smoke)
            )
    rate = {label: statistics.mean(r["samples_per_s"] for r in runs) for label, runs in results.items()}
    sync = [label for label in results if label.startswith("sync")]
    best = max(sync, key=lambda label: rate[label])
    base = results.get("sync d2")
    print(f"{args.algo} on task={args.task}, 2 model workers, seeds {args.seeds}; best synchronous: {best}")
    print(
        f"| run | samples/s | vs {best} | RL phase s | s to 80 % | held-out reward | gain (SFT std) | KL "
        "| max staleness | answers spanning versions | weights moved per step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, runs in results.items():
        reached = [t for r, b in zip(runs, base or runs) if (t := time_to_target(r, b)) is not None]
        to_target = "not reached"
        if reached:
            to_target = mean_sd(reached, "{:.1f}")
            to_target += f" ({len(reached)}/{len(runs)} seeds)" if len(reached) < len(runs) else ""
        mb = statistics.mean(r["weights_mb"] for r in runs)
        ms = statistics.mean(r["weights_ms"] for r in runs)
        print(
            f"| {label} | {mean_sd([r['samples_per_s'] for r in runs], '{:.0f}')} | {rate[label] / rate[best]:.2f}x "
            f"| {mean_sd([r['wall'] for r in runs], '{:.1f}')} | {to_target} "
            f"| {mean_sd([r['held_out'] for r in runs])} | {mean_sd([r['gain'] for r in runs])} "
            f"| {mean_sd([r['kl'] for r in runs])} | {max(r['staleness'] for r in runs):.0f} "
            f"| {statistics.mean(r['spanning'] for r in runs):.2f} | {mb:.2f} MB in {ms:.1f} ms |"
        )
    if "sync split" in results and "sync d2" in results:
        print()
        print("\n".join(on_paper(results, "sync split", "sync d2")))


if __name__ == "__main__":
    main()
