"""A toy PPO step under one layout for every call against per-call layouts, side by side.

Every candidate runs the default ``ppo`` (the embedded toy task) from the command line for
``--steps`` steps in one shared fileroot (the SFT and reward-model phases run once, shortened,
for the first candidate; the others reuse them). A step's time is the median gap between
consecutive steps' records in ``stats.jsonl`` (the first step, which includes warm-up, is left
out); the columns after it are the median per-call times the workers report
(``timing`` in each record; a call on a copy includes its reallocation and the wait for the
copy's workers to finish their earlier calls) and the bytes each step's reallocations moved.

    python benchmarks/bench_layouts.py --steps 8
    python benchmarks/bench_layouts.py --candidates d1 'actor_gen:d2m1p1,*:d1m1p1'
    python benchmarks/bench_layouts.py --smoke   # those two, 3 steps of 8 sequences, short SFT and RM
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import torch
from _smoke import SHORT_BATCHES, parse_args

DEFAULT_CANDIDATES = [
    "d1",  # one layout for everything: one worker with every core
    "d2",  # one layout for everything: two data-parallel workers
    "actor_gen:d2m1p1,*:d1m1p1",  # generation over two replicas, the rest on worker 0
    "actor_gen:d2m1p1,actor_train:d1m2p1,*:d1m1p1",  # ... and the actor trains split over both
    "ref:d1m1p1,reward:d1m1p1@1,*:d2m1p1",  # the frozen models side by side, one worker each
    # actor and critic train side by side, one worker each; the actor generates over both
    "actor_train:d1m1p1,critic:d1m1p1@1,ref:d1m1p1,reward:d1m1p1@1,*:d2m1p1",
]
SINGLE_LAYOUT = ("d1", "d2")  # the candidates that use one layout for every call


def run(candidate: str, fileroot: str, steps: int, extra: list[str]) -> list[dict]:
    trial = "".join(c if c.isalnum() else "-" for c in candidate)
    cmd = [
        sys.executable,
        "-m",
        "realrl.apps.quickstart",
        "ppo",
        f"fileroot={fileroot}",
        f"trial_name={trial}",
        f"allocation_mode={json.dumps(candidate)}",
        f"exp_ctrl.total_train_steps={steps}",
        "toy_eval_prompts=32",
        'prerequisite_overrides=["exp_ctrl.total_train_steps=40"]',
        *extra,
    ]
    log = os.path.join(fileroot, f"{trial}.log")
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{candidate}: exit {done.returncode}; see {log}")
    with open(os.path.join(fileroot, "ppo", trial, "stats.jsonl")) as f:
        return [json.loads(line) for line in f]


def summarize(candidate: str, records: list[dict]) -> dict:
    times = [r["time"] for r in records]
    gaps = [b - a for a, b in zip(times, times[1:])][1:] or [b - a for a, b in zip(times, times[1:])]

    def timing(key: str) -> float:
        values = [r["timing"].get(key, 0.0) for r in records[1:]]
        return statistics.median(values) if values else 0.0

    moved = [r.get("realloc/actor/bytes", 0.0) for r in records[1:]]
    return {
        "layout": candidate,
        "step_s": statistics.median(gaps),
        "gen_s": timing("actor_gen"),
        "actor_train_s": timing("actor_train"),
        "critic_train_s": timing("critic_train"),
        "inference_s": timing("ref_inf") + timing("rew_inf") + timing("critic_inf"),
        "realloc_s": timing("realloc/actor"),
        "wait_s": statistics.median([r.get("realloc/actor/wait_seconds", 0.0) for r in records[1:]] or [0.0]),
        "realloc_mb": statistics.median(moved) / 2**20 if moved else 0.0,
        "reward": records[-1].get("compute_adv/task_reward"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--candidates", nargs="+", default=DEFAULT_CANDIDATES)
    parser.add_argument("--fileroot", default=None, help="default: a fresh temporary folder")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every ppo run")
    args = parse_args(parser, argv, steps=3, candidates=["d1", "actor_gen:d2m1p1,*:d1m1p1"])
    if args.smoke:
        args.extra = [*SHORT_BATCHES, *args.extra]
    fileroot = args.fileroot or tempfile.mkdtemp(prefix="realrl-layouts-")
    os.makedirs(fileroot, exist_ok=True)
    print(
        f"# bench_layouts.py, {datetime.date.today()}, {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"torch {torch.__version__}; {args.steps} toy PPO steps per layout; fileroot {fileroot}",
        flush=True,
    )
    rows = []
    for candidate in args.candidates:
        rows.append(summarize(candidate, run(candidate, fileroot, args.steps, args.extra)))
        r = rows[-1]
        print(f"{candidate}: {r['step_s']:.2f} s/step", flush=True)
    singles = [r for r in rows if r["layout"] in SINGLE_LAYOUT] or rows[:1]
    base = min(singles, key=lambda r: r["step_s"])
    print(f"\nratio: against the fastest single layout for every call ({base['layout']})\n")
    print(
        "| allocation_mode | s/step | ratio | actor_gen s | actor_train s | critic_train s | inference s "
        "| realloc s (moving / waiting) | realloc MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| `{r['layout']}` | {r['step_s']:.3f} | {r['step_s'] / base['step_s']:.2f}x | {r['gen_s']:.3f} | "
            f"{r['actor_train_s']:.3f} | {r['critic_train_s']:.3f} | {r['inference_s']:.3f} | "
            f"{r['realloc_s']:.4f} / {r['wait_s']:.3f} | {r['realloc_mb']:.2f} |"
        )
    best = min(rows, key=lambda r: r["step_s"])
    print(
        f"\nfastest: {best['layout']} at {best['step_s']:.3f} s/step, "
        f"{base['step_s'] / best['step_s']:.2f}x the speed of {base['layout']}"
    )
    print("command: python " + " ".join(sys.argv))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
