"""What ``retain_freed_memory`` (realrl/base/host_memory.py) saves on a training step.

The toy reward-model step (``paired_rw.train_step``, 64 pairs, 1 thread) runs in fresh child
processes, alternately with glibc's default allocator settings and with freed memory retained;
each child times ``--iters`` steps after a warm-up and counts its minor page faults. Alternating
children share the machine's drift alike; the medians of the medians are compared.

    python benchmarks/bench_host_memory.py [--rounds 4] [--iters 30] [--fileroot DIR]
    python benchmarks/bench_host_memory.py --smoke   # 8 pairs, 1 round of 2 steps: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _smoke import parse_args  # noqa: E402


def child(mode: str, fileroot: str, iters: int, smoke: bool) -> None:
    import resource
    import time

    if mode == "retained":
        from realrl.base.host_memory import retain_freed_memory

        assert retain_freed_memory(), "glibc is needed"
    import torch
    from _trl_common import BenchSpec, prepare
    from _trl_profile import realrl_rw_step

    torch.set_num_threads(1)
    spec = BenchSpec.sized(fileroot, smoke)
    step, _ = realrl_rw_step(spec, prepare(spec))
    for _ in range(5):
        step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(json.dumps({"step_s": statistics.median(times), "faults_per_step": faults / iters}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--fileroot", default="outputs/bench_vs_trl")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parse_args(parser, argv, rounds=1, iters=2)
    if args.child:
        child(args.child, args.fileroot, args.iters, args.smoke)
        return
    results: dict[str, list[dict]] = {"default": [], "retained": []}
    for r in range(args.rounds):
        for mode in results:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--fileroot",
                args.fileroot,
                "--iters",
                str(args.iters),
                *(["--smoke"] if args.smoke else []),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"the {mode} child exited with {done.returncode}:\n{done.stderr[-3000:]}")
            results[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {mode:9s} {results[mode][-1]}", flush=True)
    med = {m: statistics.median(x["step_s"] for x in v) for m, v in results.items()}
    faults = {m: statistics.median(x["faults_per_step"] for x in v) for m, v in results.items()}
    print(f"\n| allocator | step, ms (median of {args.rounds}) | minor page faults per step |")
    print("|---|---|---|")
    for m in results:
        print(f"| {m} | {med[m] * 1e3:.1f} | {faults[m]:,.0f} |")
    print(f"\nspeed-up retained / default: {med['default'] / med['retained']:.2f}x")


if __name__ == "__main__":
    main()
