"""realrl's C kernels against the torch code they replace, inside the steps of ``bench_vs_trl.py``:
``cpu_varlen`` vs ``sdpa`` attention in a GRPO update, a generation (64 prompts x 4 answers, 13
tokens) and the reference inference; the C RMSNorm vs the torch expression in a reward-model
step and a GRPO update. Each variant in turn, interleaved, CPU time of this process, medians,
and the median of the per-round ratios (the steadier figure on a drifting machine).

    python benchmarks/bench_cpu_kernels.py [--rounds 12] [--threads 1]
    python benchmarks/bench_cpu_kernels.py --smoke   # a few sequences, 1 timed round: seconds
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _smoke import parse_args  # noqa: E402
from _trl_common import BenchSpec, prepare  # noqa: E402
from ablate_train_step import grpo_pieces, rw_step  # noqa: E402


def interleaved(phases: dict, variants: dict, rounds: int) -> dict:
    """{(phase, variant): [CPU seconds]}: every variant runs every phase once a round, the
    variants' order alternating, after two warm-up rounds."""
    times = {(p, v): [] for p in phases for v in variants}
    names = list(variants)
    for i in range(rounds + 2):
        for name in names if i % 2 else names[::-1]:
            with variants[name]():
                for phase, run in phases.items():
                    tik = time.process_time()
                    run()
                    if i >= 2:
                        times[phase, name].append(time.process_time() - tik)
    return times


def report(title: str, times: dict, phases: dict, base: str, new: str) -> None:
    print(f"{title}\n  {'':<24}{base:>12}{new:>12}{'ratio':>9}")
    for phase in phases:
        a, b = times[phase, base], times[phase, new]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        print(
            f"  {phase:<24}{1e3 * statistics.median(a):10.2f}ms{1e3 * statistics.median(b):10.2f}ms{ratio:8.2f}x"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fileroot", default="outputs/bench_vs_trl")
    args = parse_args(parser, argv, rounds=1)
    torch.set_num_threads(args.threads)
    from realrl.base.host_memory import retain_freed_memory
    from realrl.impl.model import kernels

    if not kernels.available("varlen_attention"):
        sys.exit("the C kernels are not available here (no C compiler builds them)")
    retain_freed_memory()  # as the model workers do
    spec = BenchSpec.sized(args.fileroot, args.smoke)
    paths = prepare(spec)
    pieces = grpo_pieces(spec, paths)
    model, iface = pieces["model"], pieces["interface"]
    module = model.module.module

    def attention(impl: str):
        @contextlib.contextmanager
        def use():
            module.requested_attn_impl, module._attn_key = impl, None  # re-resolved at the next call
            yield

        return use

    phases = {
        "GRPO update": pieces["update"],
        "generate": lambda: iface.generate(model, pieces["prompts"]),
        "reference inference": lambda: iface.inference(model, pieces["rollout"]),
    }
    times = interleaved(
        phases, {"sdpa": attention("sdpa"), "cpu_varlen": attention("cpu_varlen")}, args.rounds
    )
    print(f"CPU time, medians of {args.rounds} interleaved rounds, {args.threads} thread(s)")
    report("attention", times, phases, "sdpa", "cpu_varlen")

    norm_phases = {f"RM step ({spec.rw_pairs} pairs)": rw_step(spec, paths), "GRPO update": pieces["update"]}
    norms = {
        "torch": lambda: kernels.torch_only("rms_norm"),
        "C": contextlib.nullcontext,
    }
    report("RMSNorm", interleaved(norm_phases, norms, args.rounds), norm_phases, "torch", "C")


if __name__ == "__main__":
    main()
