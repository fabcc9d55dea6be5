"""Every RL algorithm on the embedded tasks, from the CLI with no other argument, per seed: the
held-out score of the SFT policy and of the trained policy, the KL to the reference and the wall
time of the RL phase (the SFT and reward-model phases run once per seed and are shared).

    python benchmarks/bench_algorithms.py --seeds 1 2 3                 # the sentiment task
    python benchmarks/bench_algorithms.py --task arith --seeds 1 2 3    # the arithmetic task
    python benchmarks/bench_algorithms.py --smoke [--task arith]        # seed 1, two algorithms, 2 steps
    python benchmarks/bench_algorithms.py --group verl --seeds 1 2 3    # verl's losses and estimators

Sentiment: the true reward (positive minus negative words, -2 without a final '.'). Arithmetic:
exact-match accuracy, greedy, on the held-out problems.
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

from realrl.experiments.tasks.arith import MAX_NEW_TOKENS

# (label, command-line arguments)
SENTIMENT_RUNS = [
    ("ppo", ["ppo"]),
    ("grpo", ["grpo"]),
    ("dr_grpo", ["grpo", "ppo_preset=dr_grpo"]),
    ("dapo", ["grpo", "ppo_preset=dapo"]),
    ("gspo", ["grpo", "ppo_preset=gspo"]),
    ("rloo", ["rloo"]),
    ("reinforce_pp", ["reinforce_pp"]),
    ("remax", ["remax"]),
]
ARITH_RUNS = [
    ("grpo", ["grpo", "task=arith"]),
    ("rloo", ["rloo", "task=arith"]),
    ("dapo", ["grpo", "task=arith", "ppo_preset=dapo"]),  # with dynamic sampling
    (
        "dapo_without_dynamic_sampling",
        ["grpo", "task=arith", "ppo_preset=dapo", "dynamic_sampling.enabled=false"],
    ),
]
# --group verl (sentiment): verl's policy losses, through their preset where one exists, and verl's
# advantage estimators, each on GRPO's graph and otherwise GRPO's options (the `grpo` row of the
# default group is the `vanilla` loss with the `grpo` estimator)
VERL_LOSS_RUNS = [
    ("cispo", ["grpo", "ppo_preset=cispo"]),
    ("gmpo", ["grpo", "ppo_preset=gmpo"]),
    ("sapo", ["grpo", "ppo_preset=sapo"]),
    *(
        (f"loss_{name}", ["grpo", f"ppo.policy_loss={name}", *options])
        for name, options in (
            ("clip_cov", []),
            ("kl_cov", []),
            ("gpg", []),
            ("dppo_tv", []),
            ("dppo_kl", []),
            ("dro", ["ppo.policy_loss_options.dro_beta=1.0"]),  # required, no default
        )
    ),
]
VERL_ESTIMATOR_RUNS = [
    (f"adv_{name}", ["grpo", f"ppo.adv_estimator={name}"])
    for name in (
        "gdpo",
        "grpo_passk",
        "opo",
        "gpg",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
    )
]
GROUPS = {
    ("sentiment", "default"): SENTIMENT_RUNS,
    ("arith", "default"): ARITH_RUNS,
    ("sentiment", "verl"): VERL_LOSS_RUNS + VERL_ESTIMATOR_RUNS,
}
# --smoke: a plain run and a preset's (on arith without dynamic sampling, which keeps no group of a
# 2-step SFT policy: it answers none right)
SMOKE_LABELS = {
    ("sentiment", "default"): ["grpo", "dapo"],
    ("arith", "default"): ["grpo", "dapo_without_dynamic_sampling"],
    ("sentiment", "verl"): ["cispo", "adv_optimal_token_baseline"],
}
# a preset's own sampling (256 tokens, top-p 0.9, 4 answers) is not the task's: keep the task's
TASK_SAMPLING = {
    "sentiment": ["ppo.gen.max_new_tokens=13", "ppo.gen.top_p=1.0", "ppo.gen.top_k=0", "ppo.gen.n=4"],
    "arith": [
        f"ppo.gen.max_new_tokens={MAX_NEW_TOKENS}",
        "ppo.gen.top_p=1.0",
        "ppo.gen.top_k=0",
        "ppo.gen.n=8",
    ],
}


def run(label: str, args: list[str], seed: int, fileroot: str, task: str, overrides: list[str]) -> dict:
    extra = TASK_SAMPLING[task] if any(a.startswith("ppo_preset=") for a in args) else []
    trial = f"{label}-seed{seed}"
    cmd = [
        sys.executable,
        "-m",
        "realrl.apps.quickstart",
        *args,
        f"fileroot={fileroot}",
        f"seed={seed}",
        *extra,
        *overrides,
    ]
    cmd.append(f"experiment_name={label}")
    start = time.time()
    with open(os.path.join(fileroot, f"{trial}.log"), "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{label} seed {seed} failed (exit {proc.returncode}); see {log.name}")
    prefix = "toy" if task == "sentiment" else "arith"
    run_dir = os.path.join(fileroot, label, f"{prefix}-seed{seed}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        rounds = [json.loads(line).get("dynamic_sampling/rounds") for line in f if line.strip()]
    # dynamic sampling: batches of prompts generated per step (1 without it)
    rounds_per_step = statistics.mean(rounds) if rounds and None not in rounds else 1.0
    return {
        "label": label,
        "seed": seed,
        "wall_s": time.time() - start,
        "rounds_per_step": rounds_per_step,
        **summary,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=("sentiment", "arith"), default="sentiment")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--group",
        choices=("default", "verl"),
        default="default",
        help="verl: verl's policy losses and advantage estimators (sentiment task only)",
    )
    parser.add_argument("--only", nargs="*", help="labels of the group to run (default: all)")
    parser.add_argument("--fileroot", default=None, help="default: a fresh temporary folder")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    args = parse_args(parser, argv, seeds=[1])
    if (args.task, args.group) not in GROUPS:
        parser.exit(2, f"--group {args.group} has no runs on --task {args.task}\n")
    if args.smoke:
        args.only = args.only or SMOKE_LABELS[args.task, args.group]
        args.extra = [*SHORT_RUN, *args.extra]
    fileroot = args.fileroot or tempfile.mkdtemp(prefix="realrl-bench-algorithms-")
    os.makedirs(fileroot, exist_ok=True)
    runs = GROUPS[args.task, args.group]
    unknown = set(args.only or ()) - {label for label, _ in runs}
    if unknown:
        parser.exit(2, f"--only: no such label in --group {args.group}: {', '.join(sorted(unknown))}\n")
    runs = [r for r in runs if not args.only or r[0] in args.only]
    before, after = (
        ("sft_true_reward_mean", "true_reward_mean")
        if args.task == "sentiment"
        else ("sft_accuracy", "accuracy")
    )
    rows = []
    for label, cli in runs:
        for seed in args.seeds:
            r = run(label, cli, seed, fileroot, args.task, args.extra)
            rows.append(r)
            print(
                json.dumps(
                    {k: r.get(k) for k in ("label", "seed", before, after, "kl", "rounds_per_step", "wall_s")}
                ),
                flush=True,
            )
    print(f"\n{args.task} task, {len(args.seeds)} seeds ({', '.join(map(str, args.seeds))}); mean (min..max)")
    print(
        "| algorithm | SFT policy | after RL | gain | KL to reference | prompt batches per step | RL wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, _ in runs:
        mine = [r for r in rows if r["label"] == label]

        def cell(key: str, mine: list[dict] = mine) -> str:
            values = [r[key] for r in mine if r.get(key) is not None]
            if not values:
                return "-"
            return f"{statistics.mean(values):.3g} ({min(values):.3g}..{max(values):.3g})"

        gains = [r[after] - r[before] for r in mine]
        gain = f"{statistics.mean(gains):+.3g} ({min(gains):+.3g}..{max(gains):+.3g})"
        row = [cell(before), cell(after), gain, cell("kl"), cell("rounds_per_step"), cell("wall_s")]
        print(f"| {label} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
