"""``cpu_varlen`` against ``sdpa`` inside the GRPO step of ``bench_vs_trl.py``: one update (64
sequences), a generation (64 prompts x 4 answers, 13 tokens) and the reference inference, with
each attention backend in turn, interleaved, CPU time of this process, medians and the median of
the per-round ratios.

    python benchmarks/bench_cpu_attention.py [--rounds 12] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _trl_common import BenchSpec, prepare  # noqa: E402
from ablate_train_step import grpo_pieces  # noqa: E402

BACKENDS = ("sdpa", "cpu_varlen")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fileroot", default="/tmp/realrl_bench_vs_trl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from realrl.base.host_memory import retain_freed_memory
    from realrl.impl.model.modules import cpu_varlen

    if not cpu_varlen.available():
        sys.exit("cpu_varlen is not available here (no C compiler builds it)")
    retain_freed_memory()  # as the model workers do
    spec = BenchSpec(fileroot=args.fileroot)
    pieces = grpo_pieces(spec, prepare(spec))
    model, iface = pieces["model"], pieces["interface"]
    module = model.module.module
    phases = {
        "GRPO update": pieces["update"],
        "generate": lambda: iface.generate(model, pieces["prompts"]),
        "reference inference": lambda: iface.inference(model, pieces["rollout"]),
    }
    times = {(p, b): [] for p in phases for b in BACKENDS}
    for i in range(args.rounds + 2):
        for backend in BACKENDS if i % 2 else BACKENDS[::-1]:
            module.requested_attn_impl, module._attn_key = backend, None  # re-resolved at the next call
            for phase, run in phases.items():
                tik = time.process_time()
                run()
                if i >= 2:  # two warm-up rounds
                    times[phase, backend].append(time.process_time() - tik)
    print(f"CPU ms (median of {args.rounds} interleaved rounds, {args.threads} thread(s))")
    print(f"  {'':<22}{'sdpa':>9}{'cpu_varlen':>12}{'ratio':>9}")
    for phase in phases:
        a, b = times[phase, "sdpa"], times[phase, "cpu_varlen"]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        print(
            f"  {phase:<22}{1e3 * statistics.median(a):9.2f}{1e3 * statistics.median(b):12.2f}{ratio:8.2f}x"
        )


if __name__ == "__main__":
    main()
