"""Parameter reallocation between two layouts: the plan vs gather-then-broadcast, on 4 gloo processes.

ReaL ("ReaL: Efficient RLHF Training of Large Language Models with Parameter Reallocation", MLSys
2025) moves a model's weights worker to worker when a call runs in another layout than training:
each destination shard receives only the slices it lacks, each from one source worker, all
messages in flight at once, over a group of the move's own workers (``realloc.reallocate``). The
baseline it is measured against (``baseline.gather_broadcast``) gathers every parameter whole on
the source's first worker and sends the whole model to every destination worker, which keeps its
slice: what a system that only moves whole models does. Both run through the same transport
(``realloc.move``), so the comparison measures the plans.

For each ordered pair (A, B) of the layouts d1m1, d2m1, d1m2, d2m2 on workers 0.. (A != B), and
two pairs on disjoint workers (d1m2@0,1 -> d2m1@2,3 and d2m1@0,1 -> d1m2@2,3): the llama model
is built with one seed on every rank, laid out in A (``parallelize``), an empty copy is built in B
(``build_copy``), and after one warm-up of each side the two are timed ``--repeats`` times,
interleaved (plan, baseline, plan, ...), a barrier before each run. A run's time is the max over
the 4 ranks of each rank's wall time from leaving the barrier to the end of its part; the table
shows the median over repeats. The warm-up runs are checked: both sides leave bit-identical B
weights, equal to the slices of the model built in A, and the bytes the ranks received sum to
what the plans say, so the benchmark cannot time something broken.

Targets: the plan moves no more bytes than the baseline for every pair, and where it moves fewer,
it takes at most 0.7x of the baseline's time. On a machine with fewer than 4 cores the 4
processes share them (time-slicing every send and receive); the printed header says so.

    python benchmarks/bench_realloc.py [--size small] [--repeats 5] [--json PATH]
    python benchmarks/bench_realloc.py --smoke   # every pair on the tiny model, 1 timed run: seconds
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
from _parallel_common import SIZES, init_group, model_config, n_params  # noqa: E402
from _smoke import parse_args  # noqa: E402

if TYPE_CHECKING:
    from realrl.api.core.layout import Placement
    from realrl.api.core.model_api import ReaLModelConfig
    from realrl.impl.model.comm.realloc_plan import ParamSpec, ReallocPlan
    from realrl.impl.model.nn.real_model import ReaLModel
    from realrl.impl.model.parallel.mesh import ParallelContext

N_WORKERS = 4
LAYOUTS = ["d1m1", "d2m1", "d1m2", "d2m2"]  # on workers 0, 1, ...
DISJOINT = [("d1m2@0,1", "d2m1@2,3"), ("d2m1@0,1", "d1m2@2,3")]
PAIRS = [(a, b) for a in LAYOUTS for b in LAYOUTS if a != b] + DISJOINT
TIME_TARGET = 0.7
TAGS_PER_PAIR = 100  # the plan's tags from pair * 100, the baseline's from pair * 100 + 50
GROUP_TIMEOUT = datetime.timedelta(seconds=120)


def placement(name: str) -> Placement:
    """``"d2m1"`` (workers 0..) or ``"d2m1@2,3"`` as a Placement."""
    from realrl.api.core.layout import Layout, Placement

    text, _, at = name.partition("@")
    layout = Layout.parse(text)
    workers = tuple(int(w) for w in at.split(",")) if at else tuple(range(layout.world_size))
    return Placement(layout, workers)


def move_workers(a: str, b: str) -> tuple[int, ...]:
    """The workers of a move from ``a`` to ``b``: the members of the group its messages use."""
    return tuple(sorted({*placement(a).workers, *placement(b).workers}))


def label(a: str, b: str) -> str:
    """A pair as the table shows it: workers only where a layout does not start at worker 0."""

    def short(name: str) -> str:
        p = placement(name)
        return name.split("@")[0] if p.workers == tuple(range(len(p.workers))) else name

    return f"{short(a)} -> {short(b)}"


def _time_max(fn: Callable[[], object]) -> tuple[float, object]:
    """Run ``fn`` on every rank after a barrier; the slowest rank's seconds (every rank gets it)."""
    import torch.distributed as dist

    dist.barrier()
    tik = time.perf_counter()
    out = fn()
    seconds = torch.tensor([time.perf_counter() - tik], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return seconds.item(), out


def _sum(value: int) -> int:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def _fill_nan(module: ReaLModel) -> None:
    """A sentinel in every shard of a copy: a slice the run does not write cannot pass the check
    by holding stale memory with the right values."""
    from realrl.impl.model.parallel.dtensor import local

    with torch.no_grad():
        for p in module.parameters():
            local(p).fill_(float("nan"))


def _check(
    rank: int, copy_plan: ReaLModel, copy_base: ReaLModel, plan: ReallocPlan, ref: dict[str, torch.Tensor]
) -> list[str]:
    """This rank's shards in both copies: bit-identical to each other and to A's model."""
    from realrl.impl.model.parallel.dtensor import local

    errors = []
    base = dict(copy_base.named_parameters())
    for name, p in copy_plan.named_parameters():
        want = ref[name][tuple(slice(lo, hi) for lo, hi in plan.dst_boxes[name][rank])]
        if not torch.equal(local(p), local(base[name])):
            errors.append(f"worker {rank}: {name} differs between the plan and the baseline")
        elif not torch.equal(local(p), want):
            errors.append(f"worker {rank}: {name} differs from the model laid out in A")
    return errors


def run_pair(
    rank: int,
    index: int,
    a: str,
    b: str,
    cfg: ReaLModelConfig,
    contexts: dict[str, ParallelContext],
    params: dict[str, ParamSpec],
    ref: dict[str, torch.Tensor],
    groups: dict[tuple[int, ...], torch.distributed.ProcessGroup],
    args: argparse.Namespace,
) -> dict | None:
    """Warm-up + check, then ``args.repeats`` interleaved timed runs of both sides of one pair."""
    import torch.distributed as dist

    from realrl.impl.model.comm.baseline import gather_broadcast
    from realrl.impl.model.comm.realloc import build_copy, reallocate, side_for
    from realrl.impl.model.comm.realloc_plan import gather_broadcast_bytes, plan_realloc
    from realrl.impl.model.nn.real_model import ReaLModel
    from realrl.impl.model.parallel.apply import parallelize

    pa, pb = placement(a), placement(b)
    side_a, side_b = side_for(cfg, pa), side_for(cfg, pb)
    plan = plan_realloc(params, side_a, side_b)
    src = None
    if rank in pa.workers:
        torch.manual_seed(0)  # the same whole model on every rank of A, then each keeps its part
        src = ReaLModel(cfg)
        parallelize(src, contexts.get(a))
    copy_plan = build_copy(cfg, contexts.get(b), "cpu", torch.float32) if rank in pb.workers else None
    copy_base = build_copy(cfg, contexts.get(b), "cpu", torch.float32) if rank in pb.workers else None
    involved = rank in (*plan.src_workers, *plan.dst_workers)
    tag = index * TAGS_PER_PAIR

    def run_plan():
        if not involved:
            return None
        return reallocate(plan, rank, src, copy_plan, args.timeout, tag, group=groups[move_workers(a, b)])

    def run_base():
        return gather_broadcast(params, side_a, side_b, rank, src, copy_base, args.timeout, tag + 50)

    for copy in (copy_plan, copy_base):
        if copy is not None:
            _fill_nan(copy)
    _, stats_plan = _time_max(run_plan)
    _, stats_base = _time_max(run_base)
    errors = _check(rank, copy_plan, copy_base, plan, ref) if copy_plan is not None else []
    plan_bytes, base_bytes = plan.total_bytes, gather_broadcast_bytes(params, side_a, side_b)
    got_plan = _sum(stats_plan.bytes_received if stats_plan else 0)
    got_base = _sum(stats_base.bytes_received)
    if rank == 0 and (got_plan, got_base) != (plan_bytes, base_bytes):
        errors.append(
            f"bytes received (plan, baseline) {(got_plan, got_base)}, planned {(plan_bytes, base_bytes)}"
        )
    n_errors = _sum(len(errors))
    for e in errors[:3]:
        print(f"[{label(a, b)}] {e}", flush=True)
    times_plan, times_base = [], []
    for _ in range(args.repeats):
        times_plan.append(_time_max(run_plan)[0])
        times_base.append(_time_max(run_base)[0])
    dist.barrier()
    if rank != 0:
        return None
    return {
        "pair": label(a, b),
        "src": str(pa),
        "dst": str(pb),
        "plan_bytes": plan_bytes,
        "baseline_bytes": base_bytes,
        "plan_ms": 1e3 * statistics.median(times_plan),
        "baseline_ms": 1e3 * statistics.median(times_base),
        "plan_ms_runs": [1e3 * t for t in times_plan],
        "baseline_ms_runs": [1e3 * t for t in times_base],
        "same_weights": n_errors == 0,
    }


def worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist

    from realrl.impl.model.comm.realloc import model_param_specs
    from realrl.impl.model.nn.real_model import ReaLModel
    from realrl.impl.model.parallel.mesh import build_contexts

    torch.set_num_threads(args.threads)
    init_group(rank, N_WORKERS, port, "cpu")
    try:
        cfg = model_config(args.size)
        names = sorted({n for pair in PAIRS for n in pair})
        contexts = build_contexts({n: placement(n) for n in names}, rank, "cpu", GROUP_TIMEOUT)
        params = model_param_specs(cfg, torch.float32)
        torch.manual_seed(0)
        ref = {n: p.detach() for n, p in ReaLModel(cfg).named_parameters()}  # what A's model holds
        # every rank creates every move's group, in one order (creating a group is collective)
        sets = sorted({move_workers(a, b) for a, b in PAIRS})
        groups = {ws: dist.new_group(list(ws), timeout=GROUP_TIMEOUT) for ws in sets}
        rows = [
            run_pair(rank, i, a, b, cfg, contexts, params, ref, groups, args)
            for i, (a, b) in enumerate(PAIRS)
        ]
        if rank == 0:
            torch.save(rows, os.path.join(out, "rows.pt"))
    finally:
        dist.destroy_process_group()


def verdict(row: dict) -> tuple[bool, bool | None, str]:
    """(bytes target met, time target met or None where it does not apply, the table's words)."""
    if not row["same_weights"]:
        return False, False, "WEIGHTS DIFFER"
    bytes_ok = row["plan_bytes"] <= row["baseline_bytes"]
    time_ok = None
    if row["plan_bytes"] < row["baseline_bytes"]:
        time_ok = row["plan_ms"] <= TIME_TARGET * row["baseline_ms"]
    words = "bytes ok" if bytes_ok else "bytes MISS"
    words += {None: ", time n/a (same bytes)", True: ", time ok", False: ", time MISS"}[time_ok]
    return bytes_ok, time_ok, words


def machine() -> str:
    cpu = platform.processor()
    if not cpu and os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return f"{cpu or platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def main() -> None:
    from realrl.base.network import find_free_port

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per side and pair, after 1 warm-up")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a reallocation may wait on a peer")
    ap.add_argument("--json", metavar="PATH", help="also write the rows and the run's details as JSON")
    args = parse_args(ap, None, size="tiny", repeats=1)
    command = "python " + shlex.join(sys.argv)
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    cores = os.cpu_count() or 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(worker, args=(find_free_port(), args, out), nprocs=N_WORKERS, join=True)
        rows = torch.load(os.path.join(out, "rows.pt"))
    seconds = time.perf_counter() - start

    size = n_params(args.size)
    share = (
        f"; this machine has {cores} CPU cores, so the {N_WORKERS} processes share them (ranks time-slice)"
        if cores < N_WORKERS * args.threads
        else ""
    )
    print(
        f"llama {args.size}: {size / 1e6:.1f}M parameters, fp32 ({size * 4 / 2**20:.1f} MiB); "
        f"{N_WORKERS} gloo processes x {args.threads} thread{share}"
    )
    print(
        f"time: median of {args.repeats} runs (after 1 warm-up) of the max over ranks of each rank's wall "
        f"time after a barrier; bytes: moved between workers (local copies excluded)"
    )
    header = f"{'pair':<22}{'plan MiB':>10}{'base MiB':>10}{'bytes':>8}{'plan ms':>10}{'base ms':>10}{'time':>8}  verdict"
    print(header)
    print("-" * (len(header) + 30))
    n_bytes = n_time = n_time_applies = 0
    for row in rows:
        bytes_ok, time_ok, words = verdict(row)
        n_bytes += bytes_ok
        n_time_applies += time_ok is not None
        n_time += bool(time_ok)
        row.update(bytes_target_met=bytes_ok, time_target_met=time_ok)
        print(
            f"{row['pair']:<22}{row['plan_bytes'] / 2**20:>10.1f}{row['baseline_bytes'] / 2**20:>10.1f}"
            f"{ratio(row['plan_bytes'], row['baseline_bytes']):>8}{row['plan_ms']:>10.1f}"
            f"{row['baseline_ms']:>10.1f}{ratio(row['plan_ms'], row['baseline_ms']):>8}  {words}"
        )
    print(
        f"summary: bytes <= baseline in {n_bytes}/{len(rows)} pairs; time <= {TIME_TARGET}x baseline in "
        f"{n_time}/{n_time_applies} pairs where the plan moves fewer bytes; "
        f"same B weights in {sum(r['same_weights'] for r in rows)}/{len(rows)}"
    )
    versions = f"torch {torch.__version__}, Python {platform.python_version()}"
    print(f"command: {command}")
    print(f"date: {date}; machine: {machine()}; {versions}; wall time {seconds:.0f} s")
    if args.json:
        meta = {
            "command": command,
            "date": date,
            "machine": machine(),
            "versions": versions,
            "args": vars(args),
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if not all(r["same_weights"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
