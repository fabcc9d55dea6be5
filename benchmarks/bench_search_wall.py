"""The search command's wall time next to its time limit: ``python -m realrl.apps.search`` run
three times in one fresh fileroot, each timed from launch to exit, beside ``search.time_limit_s``
as a ratio (the baseline: what the user allowed).

- **cold**: nothing on disk: the prerequisite phases are built (outside the limit), then every
  profile, the search and the plans run briefly (within it);
- **prerequisites cached**: their checkpoints kept, the profiles removed: what the limit bounds;
- **all cached**: profiles and the plans run briefly read from the cache: the search alone.

"after prerequisites" is the wall time less the phases' seconds (the command's own "done the ...
phase in S s" lines): the part the limit bounds; "runs" counts the short runs done and skipped.
The machine's other load slows every figure (2 shared cores: say so beside them).

    python benchmarks/bench_search_wall.py [--experiment ppo] [--limit 270] [--workers 2]
    python benchmarks/bench_search_wall.py --smoke   # sft on 1 worker: one profile run, a 120 s limit
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

from _smoke import SHORT_BATCHES, parse_args

PHASE_DONE = re.compile(r"done the \S+ phase in ([\d.]+) s")


def timed(
    args: argparse.Namespace, root: str, extra: list[str], label: str
) -> tuple[float, float, int, int, str]:
    """One search command: (wall s, prerequisite phases s, runs done, runs skipped, its last line);
    its output goes to ``<root>/search-<label>.log``."""
    cmd = [sys.executable, "-m", "realrl.apps.search", args.experiment, f"fileroot={root}"]
    cmd += ["n_nodes=1", f"n_gpus_per_node={args.workers}", f"time_limit_s={args.limit}", *extra]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    with open(os.path.join(root, f"search-{label.replace(' ', '-')}.log"), "w") as f:
        f.write(done.stdout + "\n--- stderr\n" + done.stderr)
    if done.returncode:
        raise SystemExit(f"the search command failed ({done.returncode}): {done.stderr[-2000:]}")
    phases = sum(float(s) for s in PHASE_DONE.findall(done.stderr))
    runs = len(re.findall(r"INFO: done (?:profile|move|contention|verification)", done.stderr))
    skipped = len(re.findall(r"INFO: skip ", done.stderr))
    return wall, phases, runs, skipped, done.stdout.strip().splitlines()[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="ppo")
    p.add_argument("--workers", type=int, default=2, help="n_gpus_per_node of the search")
    p.add_argument("--limit", type=float, default=270.0, help="search.time_limit_s (the command's default)")
    p.add_argument("--fileroot", default="outputs/bench_search_wall", help="emptied first")
    args = parse_args(p, None, experiment="sft", workers=1, limit=120.0)
    root = os.path.abspath(args.fileroot)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    extra = [*SHORT_BATCHES] if args.smoke else []
    if args.smoke and args.experiment == "sft":
        extra = [e for e in extra if not e.startswith(("ppo.", "toy_eval", "prerequisite"))]
    rows = [("cold", timed(args, root, extra, "cold"))]
    for path in [os.path.join(root, "plan_profiles"), *glob.glob(os.path.join(root, "*-profile"))]:
        shutil.rmtree(path)  # the profiles and their runs go; the phases' checkpoints stay
    for label in ("prerequisites cached", "all cached"):
        rows.append((label, timed(args, root, extra, label)))
    print(f"{args.experiment} search on {args.workers} workers, search.time_limit_s={args.limit:g}")
    print(
        "| run | wall s | prerequisites s | after prerequisites s | limit s | after / limit | runs done | skipped |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, (wall, phases, runs, skipped, _) in rows:
        after = wall - phases
        print(
            f"| {label} | {wall:.1f} | {phases:.1f} | {after:.1f} | {args.limit:g} | {after / args.limit:.2f}x "
            f"| {runs} | {skipped} |"
        )
    for label, (*_, last) in rows:
        if last.startswith("time limit reached"):
            print(f"{label}: {last}")


if __name__ == "__main__":
    main()
