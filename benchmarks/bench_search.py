"""The plan search against measurement: its predictions for candidate plans next to the step time
each plan measures when it runs on this machine.

The search (``realrl.apps.plan_search``: short profiling runs of every call in every layout, cached,
then the simulator over every plan of 2 workers) predicts each candidate's step time. Every
candidate then runs the experiment for ``--steps`` steps from the command line, once per round
(``--rounds``: every candidate in turn, then again, so that the machine's drift over the minutes
the runs take hits all alike); a run's step time is the median gap between consecutive steps'
records after the first two (the last step, which saves the model, left out), and a candidate's
the mean of its rounds'. Candidates: one layout
for every call (d1, d2, m2), the search's best plans (those it ran briefly before choosing among
them: ``search.verify``), and the per-call mixes of ``bench_layouts.py``. The plan whose run measured the contention between workers is marked: its
prediction matches by construction, the others' are the test.

Interpolation: a second search, in a cache of its own, profiles the experiment at half and twice
the batch size, then searches at the batch size itself from those two shapes alone (nothing runs);
its predictions for the same candidates are the column "interpolated".

    python benchmarks/bench_search.py [--experiment ppo] [--steps 10] [--rounds 2]
    python benchmarks/bench_search.py --smoke   # sft, tiny batches: d1, d2 and the search's best

Its searches run without a time limit; the command's wall time against its limit is
``bench_search_wall.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _smoke import SHORT_BATCHES, parse_args

from realrl.apps.configs import build_config, register_everything
from realrl.apps.plan_search.choose import distinct, search_plan
from realrl.apps.plan_search.profiles import step_gap
from realrl.apps.plan_search.simulator import Costs, MissingCost, simulate
from realrl.apps.plan_search.space import with_allocation

ONE_LAYOUT = ["d1m1p1", "d2m1p1", "d1m2p1"]
MIXES = [  # bench_layouts.py's per-call candidates
    "actor_gen:d2m1p1,*:d1m1p1",
    "ref_inf:d1m1p1,rew_inf:d1m1p1@1,*:d2m1p1",
    "actor_train:d1m1p1,critic_train:d1m1p1@1,critic_inf:d1m1p1@1,ref_inf:d1m1p1,rew_inf:d1m1p1@1,*:d2m1p1",
]


def measure(
    experiment: str, mode: str, steps: int, fileroot: str, extra: list[str], round_: int = 0
) -> float:
    """The median step gap of a run of ``mode`` (seconds)."""
    trial = "".join(c if c.isalnum() else "-" for c in mode) + (f"-r{round_}" if round_ else "")
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
    p.add_argument("--rounds", type=int, default=2, help="runs of every candidate, in turn")
    p.add_argument("--top", type=int, default=3, help="the search's best plans run too")
    p.add_argument("--fileroot", default="outputs/bench_search")
    p.add_argument(
        "--interpolation-workers", type=int, default=2, help="workers of the interpolation search (0: none)"
    )
    args = parse_args(p, None, experiment="sft", steps=5, top=1, interpolation_workers=1, rounds=1)
    os.makedirs(args.fileroot, exist_ok=True)
    extra = [*SHORT_BATCHES] if args.smoke else ["toy_eval_prompts=32"]
    if args.smoke and args.experiment == "sft":
        extra = [e for e in extra if not e.startswith(("ppo.", "toy_eval"))]
    # the smoke run: the code path, not the figures (no contention run, no check of the best)
    search = ["search.verify=0", "search.contention=false"] if args.smoke else []
    search.append("search.time_limit_s=null")  # every profile and plan measured, however long it takes
    register_everything()
    cfg = build_config(
        args.experiment, [f"fileroot={args.fileroot}", "search.n_gpus_per_node=2", *search, *extra]
    )
    searched = search_plan(args.experiment, cfg)
    result, exp, costs = searched.result, searched.experiment, searched.costs
    names = {m.name for m in exp.mfcs}
    chosen = searched.best.allocation_mode
    tops = [group[0].allocation_mode for group in distinct(result.ranked)[: args.top]]
    candidates = list(dict.fromkeys([*ONE_LAYOUT, *tops, *searched.measured, chosen]))
    if not args.smoke:
        candidates += [m for m in MIXES if {part.split(":")[0] for part in m.split(",")} - {"*"} <= names]
    interpolated = interpolated_costs(args, cfg, extra) if args.interpolation_workers else None
    predictions = {}
    for mode in dict.fromkeys(candidates):
        placed = with_allocation(exp, mode)
        guessed = None
        if interpolated is not None:
            try:
                guessed = simulate(placed, interpolated).step_seconds
            except MissingCost:  # a layout the interpolation search had no workers for
                pass
        predictions[mode] = (simulate(placed, costs).step_seconds, guessed)
    runs: dict[str, list[float]] = {mode: [] for mode in predictions}
    for round_ in range(args.rounds):
        for mode in predictions:
            runs[mode].append(measure(args.experiment, mode, args.steps, args.fileroot, extra, round_))
    rows = [(mode, p, g, sum(runs[mode]) / len(runs[mode])) for mode, (p, g) in predictions.items()]
    by_measured = sorted(rows, key=lambda r: r[3])
    best = by_measured[0][3]
    print(
        f"{args.experiment} on 2 workers: {result.evaluated} plans searched; {len(rows)} run for {args.steps} steps, "
        f"{args.rounds} round(s)"
    )
    print(
        "| plan | predicted s/step | measured s/step | error | measured rank | interpolated s/step | error "
        "| rounds |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode, predicted, guessed, measured in rows:
        rank = 1 + [r[0] for r in by_measured].index(mode)
        mark = " (chosen)" if mode == chosen else ""
        mark += " (contention measured on it)" if mode == searched.contention_plan else ""
        interp = "- | -" if guessed is None else f"{guessed:.3f} | {_error(guessed, measured)}"
        each = " / ".join(f"{r:.3f}" for r in runs[mode])
        print(
            f"| {mode}{mark} | {predicted:.3f} | {measured:.3f} | {_error(predicted, measured)} | {rank} | {interp} "
            f"| {each} |"
        )
    within = sum(abs(p - m) <= 0.15 * m for _, p, _, m in rows)
    chosen_measured = next(m for mode, _, _, m in rows if mode == chosen)
    print(f"predicted within 15 % of measured: {within} of {len(rows)}")
    guesses = [(g, m) for _, _, g, m in rows if g is not None]
    if guesses:
        near = sum(abs(g - m) <= 0.15 * m for g, m in guesses)
        print(f"interpolated within 15 % of measured: {near} of {len(guesses)}")
    print(
        f"the chosen plan measured {chosen_measured:.3f} s/step, {100 * (chosen_measured - best) / best:+.1f} % "
        f"from the best measured ({by_measured[0][0]})"
    )


def _error(predicted: float, measured: float) -> str:
    return f"{100 * (predicted - measured) / measured:+.1f} %"


def interpolated_costs(args: argparse.Namespace, cfg, extra: list[str]) -> Costs:
    """The costs at ``cfg``'s batch size from profiles at half and twice it only (their own cache)."""
    root = os.path.join(args.fileroot, "interpolation")
    size = cfg.dataset.train_bs_n_seqs
    kept = [e for e in extra if not e.startswith("dataset.train_bs_n_seqs=")]
    common = [
        f"fileroot={root}",
        f"search.n_gpus_per_node={args.interpolation_workers}",
        "search.verify=0",
        "search.time_limit_s=null",
        *kept,
    ]
    for n in (size // 2, size * 2):
        search_plan(args.experiment, build_config(args.experiment, [*common, f"dataset.train_bs_n_seqs={n}"]))
    at_size = search_plan(
        args.experiment, build_config(args.experiment, [*common, f"dataset.train_bs_n_seqs={size}"])
    )
    if at_size.profiled:
        raise SystemExit(f"the interpolation search at {size} sequences profiled {at_size.profiled}")
    print(f"interpolation: profiled at {size // 2} and {size * 2} sequences per step, searched at {size}")
    return at_size.costs


if __name__ == "__main__":
    main()
