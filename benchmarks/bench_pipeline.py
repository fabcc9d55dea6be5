"""Pipeline parallelism's bubble: the share of a step a stage waits, measured against the 1F1B
schedule's ideal (p - 1) / (m + p - 1), for training and for pipelined generation, and the
training step's time against the whole model on one process and against the model split over as
many processes by tensor parallelism (TP = p).

    python benchmarks/bench_pipeline.py            # p = 2 over gloo, m = 1, 2, 4, 8 micro-batches
    python benchmarks/bench_pipeline.py --smoke    # tiny sizes: the code path only

Each stage is one process with one thread. A stage's busy time is what its own work takes with
no one to wait for: its forwards and backwards on the same micro-batches, alone (training), or
the time inside its blocks and head (generation). The bubble is 1 - busy / wall, averaged over
the stages. Generation decodes a fixed number of tokens (no EOS), so every micro-batch does the
same work. The ideal assumes stages of equal cost and free communication; a real run adds the
sends and receives and any imbalance between stages.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _smoke import parse_args  # noqa: E402

from realrl.api.core.data_api import SequenceSample  # noqa: E402
from realrl.api.core.model_api import GenerationHyperparameters, ReaLModelConfig  # noqa: E402
from realrl.base.network import find_free_port  # noqa: E402
from realrl.impl.model.nn.real_model import ReaLModel  # noqa: E402
from realrl.impl.model.parallel.pipeline import (  # noqa: E402
    PipelineStage,
    StageLinks,
    StageSpec,
    train_1f1b,
)
from realrl.impl.model.parallel.pipeline_generation import Prompts, generate_pipelined  # noqa: E402


def config(args) -> ReaLModelConfig:
    return ReaLModelConfig(
        n_layers=args.layers,
        n_q_heads=4,
        n_kv_heads=4,
        hidden_dim=args.hidden,
        intermediate_dim=4 * args.hidden,
        vocab_size=args.vocab,
        n_positions=4096,
        hf_model_type="llama",
    )


def micro_batches(cfg, m: int, tokens: int) -> list[SequenceSample]:
    """``m`` micro-batches of ``tokens`` tokens each, as 4 sequences."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(m):
        lens = [tokens // 4] * 4
        ids = torch.randint(0, cfg.vocab_size, (sum(lens),), generator=g)
        out.append(
            SequenceSample.from_default(ids=[f"mb{i}"], seqlens=[lens], data={"packed_input_ids": ids})
        )
    return out


def loss_fn(logits, mb):
    ids = mb.data["packed_input_ids"]
    return torch.nn.functional.cross_entropy(logits.float()[:-1], ids[1:]), {}


class TimedStage(PipelineStage):
    """A stage that adds up the time spent in its own blocks and head."""

    busy = 0.0

    def blocks(self, x, ctx):
        t = time.perf_counter()
        out = super().blocks(x, ctx)
        self.busy += time.perf_counter() - t
        return out

    def outputs(self, x):
        t = time.perf_counter()
        out = super().outputs(x)
        self.busy += time.perf_counter() - t
        return out


def solo_train_seconds(stage: PipelineStage, mbs: list[SequenceSample], cfg) -> float:
    """This stage's forwards and backwards of ``mbs`` alone (random inputs where a stage would
    receive activations, random output gradients where it would receive them)."""
    t = time.perf_counter()
    for mb in mbs:
        ids = mb.data["packed_input_ids"]
        cu = mb.cu_seqlens("packed_input_ids")
        hidden = None if stage.spec.first else torch.randn(len(ids), cfg.hidden_dim, requires_grad=True)
        out = stage(ids, cu, hidden)
        if stage.spec.last:
            loss_fn(out, mb)[0].backward()
        else:
            out.backward(torch.randn_like(out))
    stage.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def stage_worker(rank: int, port: int, n_stages: int, args, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n_stages)
    group = dist.new_group(list(range(n_stages)))
    cfg = config(args)
    torch.manual_seed(0)
    whole = ReaLModel(cfg)
    spec = StageSpec.of(cfg, rank, n_stages)
    stage = TimedStage(copy.deepcopy(whole), spec)
    links = StageLinks(group, spec, cfg.hidden_dim)
    rows = []
    for m in args.mbs:
        mbs = micro_batches(cfg, m, args.tokens)
        walls, solos, gen_walls, gen_busy = [], [], [], []
        for _ in range(args.repeats + 1):  # the first of each is a warm-up
            dist.barrier(group)
            t = time.perf_counter()
            train_1f1b(stage, links, mbs, loss_fn, [1.0 / m] * m)
            walls.append(time.perf_counter() - t)
            stage.zero_grad(set_to_none=True)
            solos.append(solo_train_seconds(stage, mbs, cfg))
            prompts = [
                Prompts(mb.data["packed_input_ids"], mb.cu_seqlens("packed_input_ids"), torch.arange(4))
                for mb in mbs
            ]
            g = GenerationHyperparameters(max_new_tokens=args.new_tokens, greedy=True, fixed_length=True)
            stage.eval()
            stage.busy = 0.0
            dist.barrier(group)
            t = time.perf_counter()
            generate_pipelined(stage, links, prompts, g, None)
            gen_walls.append(time.perf_counter() - t)
            gen_busy.append(stage.busy)
            stage.train()
        best = min(range(1, len(walls)), key=lambda i: walls[i])
        gbest = min(range(1, len(gen_walls)), key=lambda i: gen_walls[i])
        rows.append(
            {
                "m": m,
                "train_wall": walls[best],
                "train_busy": min(solos[1:]),
                "gen_wall": gen_walls[gbest],
                "gen_busy": gen_busy[gbest],
            }
        )
    torch.save(rows, os.path.join(out_dir, f"stage{rank}.pt"))
    dist.destroy_process_group()


def whole_model_train_seconds(model: torch.nn.Module, args, m: int, group=None) -> float:
    """The training pass (forward and backward of every micro-batch) on a whole model, or on one
    tensor-parallel rank of it (``group``: its ranks start together); best of the repeats."""
    cfg = config(args)
    mbs = micro_batches(cfg, m, args.tokens)
    best = float("inf")
    for i in range(args.repeats + 1):
        if group is not None:
            dist.barrier(group)
        t = time.perf_counter()
        for mb in mbs:
            out = model(mb.data["packed_input_ids"], mb.cu_seqlens("packed_input_ids"))
            (loss_fn(out, mb)[0] / m).backward()
        model.zero_grad(set_to_none=True)
        if i:
            best = min(best, time.perf_counter() - t)
    return best


def one_process_train_seconds(args, m: int) -> float:
    """The same training pass on the whole model in one process (one thread)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return whole_model_train_seconds(ReaLModel(config(args)), args, m)


def tensor_parallel_worker(rank: int, port: int, n: int, args, out_dir: str) -> None:
    """The same training pass with the model split over ``n`` tensor-parallel processes."""
    from torch.distributed.device_mesh import init_device_mesh

    from realrl.impl.model.parallel.tensor_parallel import apply_tensor_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    torch.manual_seed(0)
    model = ReaLModel(config(args))
    apply_tensor_parallel(model, init_device_mesh("cpu", (n,)))
    group = dist.new_group(list(range(n)))
    seconds = [whole_model_train_seconds(model, args, m, group) for m in args.mbs]
    torch.save(seconds, os.path.join(out_dir, f"tp{rank}.pt"))
    dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per micro-batch (4 sequences)")
    parser.add_argument("--new-tokens", type=int, default=16, help="decoding steps per micro-batch")
    parser.add_argument("--mbs", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(
        parser, argv, layers=2, hidden=32, vocab=64, tokens=16, new_tokens=3, mbs=[1, 2], repeats=1
    )
    import tempfile

    out_dir = tempfile.mkdtemp(prefix="bench_pipeline_")
    p = args.stages
    mp.spawn(stage_worker, args=(find_free_port(), p, args, out_dir), nprocs=p, join=True)
    per_stage = [torch.load(os.path.join(out_dir, f"stage{s}.pt")) for s in range(p)]
    mp.spawn(tensor_parallel_worker, args=(find_free_port(), p, args, out_dir), nprocs=p, join=True)
    tp_seconds = [
        max(col) for col in zip(*(torch.load(os.path.join(out_dir, f"tp{r}.pt")) for r in range(p)))
    ]
    print(
        f"p={p} stages of a {args.layers}-layer llama (hidden {args.hidden}), {args.tokens} tokens per "
        f"micro-batch, {args.new_tokens} decoding steps; best of {args.repeats}, one thread per process\n"
    )
    print(
        f"| m | ideal bubble | training bubble | generation bubble | train step, one process s | "
        f"p={p} s | vs one process | TP={p} s | p={p} vs TP={p} |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for i, m in enumerate(args.mbs):
        rows = [stage[i] for stage in per_stage]
        ideal = (p - 1) / (m + p - 1)
        train = sum(1 - r["train_busy"] / r["train_wall"] for r in rows) / p
        gen = sum(1 - r["gen_busy"] / r["gen_wall"] for r in rows) / p
        wall = max(r["train_wall"] for r in rows)
        one, tp = one_process_train_seconds(args, m), tp_seconds[i]
        print(
            f"| {m} | {ideal:.2f} | {train:.2f} | {gen:.2f} | {one:.4f} | {wall:.4f} | {one / wall:.2f}x "
            f"| {tp:.4f} | {tp / wall:.2f}x |"
        )


if __name__ == "__main__":
    main()
