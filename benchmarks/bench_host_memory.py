"""What ``retain_freed_memory`` (realrl/base/host_memory.py) saves on a training step.

The toy reward-model step (``paired_rw.train_step``, 64 pairs, 1 thread) runs in fresh child
processes, alternately with glibc's default allocator settings and with freed memory retained;
each child times ``--iters`` steps after a warm-up and counts its minor page faults. Alternating
children share the machine's drift alike; the medians of the medians are compared.

    python benchmarks/bench_host_memory.py [--rounds 4] [--iters 30] [--fileroot DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def child(mode: str, fileroot: str, iters: int) -> None:
    import resource
    import time

    if mode == "retained":
        from realrl.base.host_memory import retain_freed_memory

        assert retain_freed_memory(), "glibc is needed"
    sys.path.insert(0, HERE)
    import torch
    from _trl_common import BenchSpec, prepare
    from _trl_profile import realrl_rw_step

    torch.set_num_threads(1)
    step, _ = realrl_rw_step(BenchSpec(fileroot=fileroot), prepare(BenchSpec(fileroot=fileroot)))
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--fileroot", default="/tmp/realrl_bench_vs_trl")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.fileroot, args.iters)
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
            ]
            out = (
                subprocess.run(cmd, capture_output=True, text=True, check=True)
                .stdout.strip()
                .splitlines()[-1]
            )
            results[mode].append(json.loads(out))
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
