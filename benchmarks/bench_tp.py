"""Tensor parallelism on CPU: a training step and a generation call with TP=2 vs TP=1.

The same llama config and data on both sides, both using the machine's 2 cores: TP=1 is one
process with 2 threads, TP=2 two processes (gloo) with 1 thread each, the model split by realrl's
DTensor plan (heads and MLP column-/row-wise, vocabulary split). Reported: the median wall time
of a training step (``TrainEngine.train_batch``, forward + backward + AdamW) and of a generation
call (``InferenceEngine.generate``, greedy, fixed new tokens), and TP=2's ratio. No target: on a
CPU the all-reduces per block cost more than the halved matmuls save; tensor parallelism is for
models that do not fit one device. Also checked: both sides produce the same greedy tokens.

    python benchmarks/bench_tp.py [--size small] [--steps 3] [--new-tokens 32] [--prompts 16]
    python benchmarks/bench_tp.py --smoke   # the tiny model, 1 step, 2 prompts x 4 tokens: seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
from _parallel_common import SIZES, batch, init_group, model_config, n_params, n_tokens, token_loss  # noqa: E402
from _smoke import parse_args  # noqa: E402

LENGTHS = [96, 160, 64, 200, 128, 112, 80, 144]


def measure(args, parallel, device: str) -> dict:
    """Step and generation times of one side (collective when ``parallel`` is split)."""
    import torch.distributed as dist

    from realrl.api.core.data_api import MicroBatchSpec
    from realrl.api.core.model_api import GenerationHyperparameters
    from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
    from realrl.impl.model.backend.engine import InferenceEngine
    from realrl.impl.model.backend.train_engine import TrainEngine
    from realrl.impl.model.nn.real_model import ReaLModel
    from realrl.impl.model.parallel.apply import parallelize

    def barrier() -> None:
        if parallel is not None:
            dist.barrier()

    def build() -> ReaLModel:
        torch.manual_seed(0)
        module = ReaLModel(model_config(args.size), device=device)
        parallelize(module, parallel)
        return module

    train = TrainEngine(build(), OptimizerConfig(lr=1e-4), EngineConfig(dtype="fp32"), 100, device, parallel)
    step_times = []
    for step in range(args.steps + 1):
        data = batch(train.module.config.vocab_size, LENGTHS, seed=step)
        barrier()
        tik = time.perf_counter()
        train.train_batch(data, MicroBatchSpec(n_mbs=2), token_loss, n_tokens, version_steps=step)
        barrier()
        if step:
            step_times.append(time.perf_counter() - tik)
    gen = InferenceEngine(build(), EngineConfig(dtype="fp32"), device, parallel)
    lengths = torch.randint(8, 48, (args.prompts,), generator=torch.Generator().manual_seed(7)).tolist()
    prompts = batch(gen.module.config.vocab_size, lengths, seed=99, key="packed_prompts")
    gconfig = GenerationHyperparameters(
        max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, greedy=True
    )
    gen_times, tokens = [], None
    for _ in range(args.steps + 1):
        barrier()
        tik = time.perf_counter()
        out = gen.generate(prompts, None, tokenizer=None, gconfig=gconfig)
        barrier()
        gen_times.append(time.perf_counter() - tik)
        tokens = out.sequences
    return {"step": statistics.median(step_times), "gen": statistics.median(gen_times[1:]), "tokens": tokens}


def tp_worker(rank: int, port: int, args, out: str) -> None:
    import torch.distributed as dist

    from realrl.api.core.layout import Layout, Placement
    from realrl.impl.model.parallel.mesh import build_contexts

    torch.set_num_threads(args.threads // 2 or 1)
    device = init_group(rank, 2, port, "cpu")
    try:
        parallel = build_contexts({"m": Placement(Layout(1, 2, 1), (0, 1))}, rank, "cpu")["m"]
        result = measure(args, dataclasses.replace(parallel, fsdp=False), device)
        if rank == 0:
            torch.save(result, os.path.join(out, "tp2.pt"))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    from realrl.base.network import find_free_port

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads in all, per side")
    args = parse_args(ap, argv, size="tiny", steps=1, prompts=2, new_tokens=4)
    torch.set_num_threads(args.threads)
    one = measure(args, None, "cpu")
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(tp_worker, args=(find_free_port(), args, out), nprocs=2, join=True)
        two = torch.load(os.path.join(out, "tp2.pt"))
    size = n_params(args.size)
    print(f"llama {args.size}: {size / 1e6:.1f}M parameters, fp32, {args.threads} CPU threads per side")
    print(f"{'':<44}{'TP=1':>12}{'TP=2':>12}{'ratio':>9}")
    rows = (
        (f"train step, {sum(LENGTHS)} tokens, 2 micro-batches", "step"),
        (f"generate {args.prompts} prompts x {args.new_tokens} tokens", "gen"),
    )
    for label, key in rows:
        print(f"{label:<44}{one[key]:>11.3f}s{two[key]:>11.3f}s{two[key] / one[key]:>8.2f}x")
    print(f"same greedy tokens: {torch.equal(one['tokens'], two['tokens'])}")


if __name__ == "__main__":
    main()
