"""Mixture-of-Experts block tokens/s: realrl's grouped expert dispatch against transformers' block.

Part 1, one process: ``realrl.impl.model.nn.moe.MoE`` and transformers'
``Qwen3MoeSparseMoeBlock`` with the same weights copied in (router, and each expert's gate / up /
down into its fused ``gate_up_proj`` / ``down_proj``), on the same packed tokens: a forward
without gradients (inference, decoding's prefill) and a forward + backward (training: gradients
of every weight and of the input). transformers runs its default expert loop (``eager``) and its
``grouped_mm`` kernel (``config._experts_implementation``). Median wall time of ``--repeats``
runs, the sides alternated run by run so that other load hits them alike; the outputs are
compared first (same routing, same sums).

Part 2, two processes of one thread (gloo), the same tokens in all, when realrl's expert
parallelism is present (``<role>.engine.expert_parallel``): the block replicated (each rank
holds every expert and half the tokens, as data parallelism), split by tensor parallelism
(every expert's inner dimension halved, every token on both ranks) and with whole experts per
rank (expert parallelism: half the experts each, every token on both ranks, one all-reduce of
the output). Where the option is absent the row says "not available".

    python benchmarks/bench_moe.py [--hidden 256] [--experts 8] [--top-k 2] [--inner 512] [--tokens 4096]
    python benchmarks/bench_moe.py --smoke   # hidden 32, 4 experts, 128 tokens: seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from _parallel_common import init_group  # noqa: E402
from _smoke import parse_args  # noqa: E402

HF_IMPLS = ("eager", "grouped_mm")
SMOKE = {"hidden": 32, "experts": 4, "top_k": 2, "inner": 64, "tokens": 128, "repeats": 1}


def model_config(args):
    """A one-block ReaLModel config whose only sparse block is the one measured."""
    from realrl.api.core.model_api import ReaLModelConfig

    heads = max(2, args.hidden // 64)  # two at least: tensor parallelism over 2 splits the heads
    return ReaLModelConfig(
        n_layers=1,
        n_q_heads=heads,
        n_kv_heads=heads,
        hidden_dim=args.hidden,
        intermediate_dim=args.inner,
        vocab_size=64,
        n_experts=args.experts,
        n_experts_per_tok=args.top_k,
        moe_intermediate_dim=args.inner,
        norm_topk_prob=True,
    )


def realrl_block(args) -> nn.Module:
    """The sparse block of a seeded one-block ReaLModel (the same weights in every process)."""
    from realrl.impl.model.nn.real_model import ReaLModel

    torch.manual_seed(args.seed)
    return ReaLModel(model_config(args)).layers[0].mlp


def hf_block(args, ours: nn.Module, impl: str) -> nn.Module:
    """transformers' Qwen3-MoE block running experts with ``impl``, holding ``ours``' weights."""
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=args.hidden,
        moe_intermediate_size=args.inner,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        norm_topk_prob=True,
        num_hidden_layers=1,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 64),
        hidden_act="silu",
    )
    cfg._experts_implementation = impl
    block = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        block.gate.weight.copy_(ours.router.weight)
        for e, expert in enumerate(ours.experts.children()):  # a ModuleList or a ModuleDict by index
            block.experts.gate_up_proj[e].copy_(torch.cat([expert.gate.weight, expert.up.weight]))
            block.experts.down_proj[e].copy_(expert.down.weight)
    return block


def passes(block: nn.Module, x: torch.Tensor, hf: bool) -> dict[str, Callable[[], None]]:
    """The two measured passes of ``block`` on tokens ``x`` [T, hidden]."""
    inp = x[None] if hf else x  # transformers' block takes [batch, seq, hidden]
    grad_in = inp.detach().clone().requires_grad_(True)
    weights = torch.randn(inp.shape, generator=torch.Generator().manual_seed(3))

    def forward() -> None:
        with torch.no_grad():
            block(inp)

    def forward_backward() -> None:
        (block(grad_in) * weights).sum().backward()
        block.zero_grad(set_to_none=True)
        grad_in.grad = None

    return {"forward": forward, "forward+backward": forward_backward}


def median_seconds(fns: list[Callable[[], None]], repeats: int, barrier=lambda: None) -> list[float]:
    """Median wall seconds of each function, alternated run by run, after one warm-up each."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            barrier()
            t0 = time.perf_counter()
            fn()
            barrier()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def one_process(args) -> tuple[float, dict[str, dict[str, float | None]]]:
    """(max |realrl - transformers| of the outputs, pass -> side -> tokens/s)."""
    torch.set_num_threads(args.threads)
    ours = realrl_block(args)
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(args.seed + 1))
    sides: dict[str, nn.Module] = {"realrl": ours}
    for impl in HF_IMPLS:
        try:
            sides[impl] = hf_block(args, ours, impl)
            with torch.no_grad():
                sides[impl](x[None])
        except (RuntimeError, NotImplementedError, ValueError, KeyError) as e:  # this torch lacks it
            print(f"transformers {impl}: not available ({type(e).__name__}: {str(e)[:80]})")
            sides.pop(impl, None)
    with torch.no_grad():
        ref = ours(x)
        diffs = [float((sides[i](x[None])[0] - ref).abs().max()) for i in sides if i != "realrl"]
    diff = max(diffs, default=float("nan"))
    out: dict[str, dict[str, float | None]] = {}
    for name in ("forward", "forward+backward"):
        fns = {side: passes(block, x, side != "realrl")[name] for side, block in sides.items()}
        seconds = median_seconds(list(fns.values()), args.repeats)
        out[name] = {side: args.tokens / s for side, s in zip(fns, seconds)}
        out[name].update({i: None for i in HF_IMPLS if i not in fns})
    return diff, out


def expert_parallel_available() -> str | None:
    """None when realrl has expert parallelism, else why not."""
    from realrl.impl.model.backend.config import EngineConfig
    from realrl.impl.model.parallel.mesh import ParallelContext

    for cls in (EngineConfig, ParallelContext):
        if "expert_parallel" not in {f.name for f in dataclasses.fields(cls)}:
            return f"{cls.__name__} has no expert_parallel option"
    return None


LAYOUTS = ("replicated, d2", "tensor parallel, d1m2", "expert parallel, d1m2")


def layout_worker(rank: int, port: int, args, out: str) -> None:
    """Both ranks: each layout's block, its passes timed between barriers (rank 0 saves them)."""
    import torch.distributed as dist

    from realrl.api.core.layout import Layout, Placement
    from realrl.impl.model.nn.real_model import ReaLModel
    from realrl.impl.model.parallel.apply import parallelize
    from realrl.impl.model.parallel.mesh import build_contexts

    torch.set_num_threads(1)
    init_group(rank, 2, port, "cpu")
    try:
        tp = build_contexts({"m": Placement(Layout(1, 2, 1), (0, 1))}, rank, "cpu")["m"]
        x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(args.seed + 1))
        whole = realrl_block(args)
        with torch.no_grad():
            ref = whole(x)
        results, diffs = {}, {}
        for name in LAYOUTS:
            if name.startswith("replicated"):  # data parallelism: every expert, half the tokens
                block, tokens = whole, x.chunk(2)[rank]
            else:
                torch.manual_seed(args.seed)
                model = ReaLModel(model_config(args))
                ep = name.startswith("expert")
                parallelize(model, dataclasses.replace(tp, fsdp=False, expert_parallel=ep))
                block, tokens = model.layers[0].mlp, x
                with torch.no_grad():
                    diffs[name] = float((block(x) - ref).abs().max())
            fns = passes(block, tokens, hf=False)
            seconds = median_seconds(list(fns.values()), args.repeats, dist.barrier)
            results[name] = {p: args.tokens / s for p, s in zip(fns, seconds)}
        if rank == 0:
            torch.save({"tok_s": results, "diff": diffs}, os.path.join(out, "layouts.pt"))
    finally:
        dist.destroy_process_group()


def two_processes(args) -> dict:
    from realrl.base.network import find_free_port

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(layout_worker, args=(find_free_port(), args, out), nprocs=2, join=True)
        return torch.load(os.path.join(out, "layouts.pt"))


def report(args, diff: float, single: dict, layouts: dict | str) -> None:
    print(
        f"MoE block: hidden {args.hidden}, {args.experts} experts of inner size {args.inner}, top-{args.top_k} "
        f"(renormalised), {args.tokens} tokens, fp32, CPU; one process of {args.threads} threads; median "
        f"of {args.repeats} runs, sides alternated"
    )
    print(f"outputs: max |realrl - transformers| = {diff:.2e}")
    head = " | ".join(f"transformers {i} tok/s | realrl / {i}" for i in HF_IMPLS)
    print(f"| pass | realrl tok/s | {head} |")
    print("|---|---|" + "---|---|" * len(HF_IMPLS))
    for name, row in single.items():
        cells = []
        for impl in HF_IMPLS:
            hf = row[impl]
            cells += ["n/a", "n/a"] if hf is None else [f"{hf:,.0f}", f"{row['realrl'] / hf:.2f}x"]
        print(f"| {name} | {row['realrl']:,.0f} | " + " | ".join(cells) + " |")
    print()
    print(f"layouts of the block over 2 processes x 1 thread (gloo), {args.tokens} tokens in all:")
    print(
        "| layout | forward tok/s | forward+backward tok/s | forward vs replicated | fwd+bwd vs replicated |"
    )
    print("|---|---|---|---|---|")
    if isinstance(layouts, str):
        print(f"| expert parallel | not available: {layouts} | | | |")
        return
    base = layouts["tok_s"][LAYOUTS[0]]
    for name in LAYOUTS:
        r = layouts["tok_s"][name]
        ratios = [f"{r[p] / base[p]:.2f}x" for p in ("forward", "forward+backward")]
        print(f"| {name} | {r['forward']:,.0f} | {r['forward+backward']:,.0f} | {' | '.join(ratios)} |")
    diffs = ", ".join(f"{n} {d:.1e}" for n, d in layouts["diff"].items())
    print(f"outputs against the whole block: max |diff| {diffs}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--inner", type=int, default=512, help="each expert's inner size")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of the one-process part")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-layouts", action="store_true", help="part 1 only")
    args = parse_args(ap, argv, **SMOKE)
    diff, single = one_process(args)
    missing = "skipped (--skip-layouts)" if args.skip_layouts else expert_parallel_available()
    report(args, diff, single, missing if missing else two_processes(args))


if __name__ == "__main__":
    main()
