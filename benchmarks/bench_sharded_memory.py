"""Per-rank memory and step time of training with FSDP2 over N ranks vs N replicated ranks.

Both sides train the same llama config from the same weights on the same data, data parallel over
N local processes (gloo on CPU): "replicated" keeps whole parameters, gradients and AdamW state on
every rank and all-reduces the gradients (realrl's data-parallel engine); "fsdp" is the same
engine with ``engine.fsdp=true`` (FSDP2 ``fully_shard`` per block and at the root). Reported per
rank, measured after a step's backward (when gradients and optimizer state coexist):

- state: bytes of parameters + gradients + optimizer state this rank holds (DTensor shards
  counted by their local part) — what sharding divides;
- peak: the process's peak memory during the timed steps (after a warm-up step, so the whole
  model every rank builds before sharding it is not counted): on CPU the resident set's high-water
  mark (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``; host memory, which also holds
  activations, gathered blocks and what the allocator keeps), on CUDA
  ``torch.cuda.max_memory_allocated``. On CPU both sides set glibc's mmap threshold to 64 KiB
  (``mallopt``), so a freed large block goes back to the OS at once: with glibc's default
  (``--glibc-defaults``) the threshold grows as blocks are freed and FSDP's many transient
  full-block buffers (gathered weights, unsharded gradients) stay resident, which measures the
  allocator rather than the sharding;
- step: the median wall time of a training step after a warm-up.

Target (set when FSDP was added): state with FSDP <= 0.55x of a replica at N = 2.

    python benchmarks/bench_sharded_memory.py [--size small] [--n-ranks 2] [--steps 4] [--device cpu]
    python benchmarks/bench_sharded_memory.py --smoke   # the tiny model, 1 timed step: seconds
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
from _parallel_common import SIZES, batch, init_group, model_config, n_params, n_tokens, token_loss  # noqa: E402
from _smoke import parse_args  # noqa: E402

LENGTHS = [96, 160, 64, 200, 128, 112]


def local_bytes(t: torch.Tensor) -> int:
    from realrl.impl.model.parallel.dtensor import local

    t = local(t)
    return t.numel() * t.element_size()


def state_bytes(engine) -> int:
    total = 0
    for p in engine.module.parameters():
        total += local_bytes(p)
        if p.grad is not None:
            total += local_bytes(p.grad)
    for s in engine.optimizer.state.values():
        total += sum(local_bytes(v) for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the resident set's high-water mark (Linux)


def peak_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(rank: int, world: int, port: int, args, fsdp: bool, out: str) -> None:
    import torch.distributed as dist

    from realrl.api.core.data_api import MicroBatchSpec
    from realrl.api.core.layout import Layout, Placement
    from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
    from realrl.impl.model.backend.train_engine import TrainEngine
    from realrl.impl.model.nn.real_model import ReaLModel
    from realrl.impl.model.parallel.apply import parallelize
    from realrl.impl.model.parallel.mesh import build_contexts

    torch.set_num_threads(args.threads)
    if args.device == "cpu" and not args.glibc_defaults:
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    device = init_group(rank, world, port, args.device)
    try:
        parallel = build_contexts(
            {"m": Placement(Layout(dp=world), tuple(range(world)))}, rank, device.split(":")[0]
        )
        parallel = dataclasses.replace(parallel["m"], fsdp=fsdp)
        torch.manual_seed(0)
        module = ReaLModel(model_config(args.size), device=device)
        parallelize(module, parallel)
        engine = TrainEngine(
            module, OptimizerConfig(lr=1e-4), EngineConfig(dtype="fp32"), 100, device, parallel
        )
        times, state = [], 0
        for step in range(args.steps + 1):
            data = batch(module.config.vocab_size, LENGTHS, seed=100 * step + rank)
            dist.barrier()
            tik = time.perf_counter()
            engine.optimizer.zero_grad(set_to_none=True)
            engine.accumulate_gradients(data, MicroBatchSpec(n_mbs=2), token_loss, n_tokens)
            state = max(state, state_bytes(engine))  # gradients and (after step 1) optimizer state
            engine.optimizer_step(step)
            dist.barrier()
            if step:
                times.append(time.perf_counter() - tik)
            else:
                reset_peak(device)
        state = max(state, state_bytes(engine))
        torch.save(
            {
                "state": state,
                "peak": peak_bytes(device),
                "step": statistics.median(times),
                "params": n_params(args.size),
            },
            os.path.join(out, f"{'fsdp' if fsdp else 'replicated'}-rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def run(args, fsdp: bool, out: str) -> list[dict]:
    from realrl.base.network import find_free_port

    mp.spawn(worker, args=(args.n_ranks, find_free_port(), args, fsdp, out), nprocs=args.n_ranks, join=True)
    name = "fsdp" if fsdp else "replicated"
    return [torch.load(os.path.join(out, f"{name}-rank{r}.pt")) for r in range(args.n_ranks)]


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--n-ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--glibc-defaults", action="store_true", help="keep glibc's dynamic mmap threshold")
    args = parse_args(ap, argv, size="tiny", steps=1)
    with tempfile.TemporaryDirectory() as out:
        replicated, sharded = run(args, False, out), run(args, True, out)
    params = replicated[0]["params"]
    print(
        f"llama {args.size}: {params / 1e6:.1f}M parameters, fp32 AdamW, {args.n_ranks} ranks on {args.device}"
    )
    print(f"{'per rank (max over ranks)':<34}{'replicated':>16}{'fsdp':>16}{'ratio':>9}")
    for key, label, fmt in (
        ("state", "params + grads + optimizer", mib),
        ("peak", "peak memory in steps" + (" (RSS)" if args.device == "cpu" else ""), mib),
        ("step", "step time (median)", lambda s: f"{s:.3f} s"),
    ):
        a, b = max(r[key] for r in replicated), max(r[key] for r in sharded)
        print(f"{label:<34}{fmt(a):>16}{fmt(b):>16}{b / a:>8.2f}x")
    ratio = max(r["state"] for r in sharded) / max(r["state"] for r in replicated)
    target = 0.55 if args.n_ranks == 2 else None
    if target is not None:
        print(
            f"target: state ratio <= {target} at N=2: {'met' if ratio <= target else 'NOT met'} ({ratio:.3f})"
        )


if __name__ == "__main__":
    main()
