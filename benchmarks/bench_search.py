"""The plan search against measurement: its predictions for candidate plans next to the step time
each plan measures when it runs on this machine.

The search (``realrl.apps.search``: short profiling runs of every call in every layout, cached,
then the simulator over every plan of 2 workers) predicts each candidate's step time. Every
candidate then runs the experiment for ``--steps`` steps from the command line; its step time is
the median gap between consecutive steps' records after the first two (the last step, which
saves the model, left out). Candidates: one layout
for every call (d1, d2, m2), the search's best plans, and the per-call mixes of
``bench_layouts.py``.

    python benchmarks/bench_search.py [--experiment ppo] [--steps 10]
    python benchmarks/bench_search.py --smoke   # sft, tiny batches: d1, d2 and the search's best
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _smoke import SHORT_BATCHES, parse_args

from realrl.api.quickstart.plan_space import with_allocation
from realrl.apps.configs import build_config, register_everything
from realrl.apps.profiles import step_gap
from realrl.apps.search import search_plan
from realrl.system.simulator import simulate

ONE_LAYOUT = ["d1m1p1", "d2m1p1", "d1m2p1"]
MIXES = [  # bench_layouts.py's per-call candidates
    "actor_gen:d2m1p1,*:d1m1p1",
    "ref_inf:d1m1p1,rew_inf:d1m1p1@1,*:d2m1p1",
    "actor_train:d1m1p1,critic_train:d1m1p1@1,critic_inf:d1m1p1@1,ref_inf:d1m1p1,rew_inf:d1m1p1@1,*:d2m1p1",
]


def measure(experiment: str, mode: str, steps: int, fileroot: str, extra: list[str]) -> float:
    """The median step gap of a run of ``mode`` (seconds)."""
    trial = "".join(c if c.isalnum() else "-" for c in mode)
    cmd = [sys.executable, "-m", "realrl.apps.quickstart", experiment, f"fileroot={fileroot}"]
    cmd += [
        f"experiment_name={experiment}-bench",
        f"trial_name={trial}",
        f"allocation_mode={json.dumps(mode)}",
    ]
    cmd += [f"exp_ctrl.total_train_steps={steps}", *extra]
    log = os.path.join(fileroot, f"bench-{trial}.log")
    with open(log, "w") as out:
        if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode:
            raise SystemExit(f"{mode} failed; see {log}")
    with open(os.path.join(fileroot, f"{experiment}-bench", trial, "stats.jsonl")) as f:
        times = [json.loads(line)["time"] for line in f]
    return step_gap([{"time": t} for t in times])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="ppo")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=3, help="the search's best plans run too")
    p.add_argument("--fileroot", default="outputs/bench_search")
    args = parse_args(p, None, experiment="sft", steps=8, top=1)
    os.makedirs(args.fileroot, exist_ok=True)
    extra = [*SHORT_BATCHES] if args.smoke else ["toy_eval_prompts=32"]
    if args.smoke and args.experiment == "sft":
        extra = [e for e in extra if not e.startswith(("ppo.", "toy_eval"))]
    register_everything()
    cfg = build_config(args.experiment, [f"fileroot={args.fileroot}", "search.n_gpus_per_node=2", *extra])
    searched = search_plan(args.experiment, cfg)
    result, exp, costs = searched.result, searched.experiment, searched.costs
    names = {m.name for m in exp.mfcs}
    chosen = result.ranked[0].allocation_mode
    candidates = list(dict.fromkeys([*ONE_LAYOUT, *(c.allocation_mode for c in result.ranked[: args.top])]))
    if not args.smoke:
        candidates += [m for m in MIXES if {part.split(":")[0] for part in m.split(",")} - {"*"} <= names]
    rows = []
    for mode in dict.fromkeys(candidates):
        predicted = simulate(with_allocation(exp, mode), costs).step_seconds
        measured = measure(args.experiment, mode, args.steps, args.fileroot, extra)
        rows.append((mode, predicted, measured))
    by_measured = sorted(rows, key=lambda r: r[2])
    best = by_measured[0][2]
    print(
        f"{args.experiment} on 2 workers: {result.evaluated} plans searched; {len(rows)} run for {args.steps} steps"
    )
    print("| plan | predicted s/step | measured s/step | error | measured rank |")
    print("|---|---|---|---|---|")
    for mode, predicted, measured in rows:
        rank = 1 + [r[0] for r in by_measured].index(mode)
        mark = " (chosen)" if mode == chosen else ""
        print(
            f"| {mode}{mark} | {predicted:.3f} | {measured:.3f} | {100 * (predicted - measured) / measured:+.1f} % "
            f"| {rank} |"
        )
    within = sum(abs(p - m) <= 0.15 * m for _, p, m in rows)
    chosen_measured = next(m for mode, _, m in rows if mode == chosen)
    print(f"predicted within 15 % of measured: {within} of {len(rows)}")
    print(
        f"the chosen plan measured {chosen_measured:.3f} s/step, {100 * (chosen_measured - best) / best:+.1f} % "
        f"from the best measured ({by_measured[0][0]})"
    )


if __name__ == "__main__":
    main()
