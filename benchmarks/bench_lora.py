"""LoRA against full fine-tuning on the same model: what each holds and moves, how fast a step is,
and what the toy RL runs learn with each.

Part 1, one llama-family model (default: 8 layers, hidden 512, vocab 8192: 29M parameters), trained
by realrl's TrainEngine on the same packed batches: parameters trained, optimizer-state bytes,
peak RSS of a training step (one fresh process per side, as ``bench_train.py`` measures it), the
fastest of ``--steps`` step times (both sides interleaved, so other load hits both alike), and
the bytes a reallocation moves into a generation copy each step (full: the whole model; LoRA:
the adapters, once the kept copy holds the base).

Part 2, the embedded sentiment task from the command line per seed: PPO and GRPO with and
without ``actor.lora.rank`` (LoRA at ``--lora-lr``, full fine-tuning at the default learning
rate): the trained policy's gain over the SFT policy in SFT standard deviations, the KL to the
reference and the RL phase's wall time (the SFT and reward phases run once per seed, shared).

    python benchmarks/bench_lora.py [--seeds 1 2 3] [--rank 8] [--skip-learning]
    python benchmarks/bench_lora.py --smoke    # a tiny model, one step, one seed of a 2-step LoRA run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from _smoke import SHORT_RUN, parse_args
from _step_memory import step_peak_rss

SIDES = ("full", "lora")


def model_config(args):
    from realrl.api.core.model_api import ReaLModelConfig

    return ReaLModelConfig(
        n_layers=args.layers,
        n_q_heads=args.hidden // 64 or 1,
        n_kv_heads=args.hidden // 64 or 1,
        hidden_dim=args.hidden,
        intermediate_dim=args.hidden * 8 // 3,
        vocab_size=args.vocab,
        n_positions=4096,
    )


def lora_config(args):
    from realrl.api.core.lora import LoRAConfig

    return LoRAConfig(rank=args.rank, alpha=2.0 * args.rank)


def make_batch(args, step: int):
    from realrl.api.core.data_api import SequenceSample

    g = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(args.min_len, args.max_len + 1, (args.n_seqs,), generator=g).tolist()
    ids = torch.randint(0, args.vocab, (sum(lengths),), generator=g)
    return SequenceSample.from_default(
        ids=list(range(len(lengths))), seqlens=lengths, data={"packed_input_ids": ids}
    )


def trainer(side: str, args) -> tuple[Callable[[int], float], object]:
    """One side's training step (``step(i)`` trains on batch ``i``) and its engine."""
    from realrl.api.core.data_api import MicroBatchSpec
    from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
    from realrl.impl.model.backend.train_engine import TrainEngine
    from realrl.impl.model.nn import ReaLModel
    from realrl.impl.model.nn.lora import add_adapters
    from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

    torch.manual_seed(args.seed)
    module = ReaLModel(model_config(args))
    if side == "lora":
        add_adapters(module, lora_config(args), seed=args.seed)
    opt = OptimizerConfig(lr=1e-4, grad_clip=1.0)
    engine = TrainEngine(module, opt, EngineConfig(dtype="fp32"), args.steps + 2)

    def loss_fn(logits, mb):
        ids = mb.data["packed_input_ids"]
        return -gather_packed_shifted_log_probs(logits, mb.cu_seqlens("packed_input_ids"), ids).mean(), {}

    def n_predictions(mb):
        return float(sum(n - 1 for n in mb.flat_seqlens("packed_input_ids")))

    def step(i: int) -> float:
        batch = make_batch(args, i)
        return engine.train_batch(
            batch, MicroBatchSpec(n_mbs=args.n_mbs), loss_fn, n_predictions, version_steps=i
        )["loss"]

    return step, engine


def optimizer_bytes(engine) -> int:
    return sum(
        t.numel() * t.element_size()
        for state in engine.optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t)
    )


def realloc_bytes(args) -> dict[str, int]:
    """What one reallocation into a kept fp32 generation copy moves, from the plan's parameter
    specs: the whole model (full fine-tuning, and LoRA's first move), or the adapters alone."""
    from realrl.impl.model.comm.realloc import model_param_specs

    cfg, lora = model_config(args), lora_config(args)

    def total(specs) -> int:
        return sum(
            torch.Size(s.shape).numel() * torch.empty(0, dtype=s.dtype).element_size() for s in specs.values()
        )

    return {
        "full": total(model_param_specs(cfg, torch.float32)),
        "lora_first": total(model_param_specs(cfg, torch.float32, lora)),
        "lora": total(model_param_specs(cfg, torch.float32, lora, trained_only=True)),
    }


def measure_rss(side: str, args) -> dict:
    """In a fresh process: peak RSS of a training step after a warm-up step
    (``_step_memory.step_peak_rss``). Both sides import peft first, so the libraries loaded are
    the same."""
    import peft  # noqa: F401

    step, engine = trainer(side, args)
    return step_peak_rss(lambda: step(0), lambda: step(1))


def part_engine(args) -> dict:
    steps, engines = {}, {}
    for side in SIDES:
        steps[side], engines[side] = trainer(side, args)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(args.steps + 1):  # step 0 warms up
        for side in SIDES:
            tik = time.perf_counter()
            steps[side](i)
            if i:
                times[side].append(time.perf_counter() - tik)
    rss = {}
    for side in SIDES:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--rss-side", side]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rss[side] = json.loads(out.split("RESULT ", 1)[1])
    trained = {
        side: sum(p.numel() for p in engines[side].module.parameters() if p.requires_grad) for side in SIDES
    }
    return {
        "params": sum(p.numel() for p in engines["full"].module.parameters()),
        "trained": trained,
        "optimizer_bytes": {side: optimizer_bytes(engines[side]) for side in SIDES},
        "step_s": {side: min(t) for side, t in times.items()},
        "peak_rss_mb": {side: rss[side]["peak_rss"] for side in SIDES},
        "step_rss_mb": {side: rss[side]["peak_rss"] - rss[side]["rss_before"] for side in SIDES},
        "realloc": realloc_bytes(args),
    }


LEARNING_RUNS = {
    "ppo": ["ppo"],
    "grpo": ["grpo"],
}


def learn(label: str, argv: list[str], seed: int, fileroot: str, extra: list[str]) -> dict:
    trial = f"{label}-seed{seed}"
    cmd = [sys.executable, "-m", "realrl.apps.quickstart", *argv, f"fileroot={fileroot}", f"seed={seed}"]
    cmd += [f"experiment_name={label}", *extra]
    with open(os.path.join(fileroot, f"{trial}.log"), "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{trial} failed (exit {proc.returncode}); see {fileroot}/{trial}.log")
    run_dir = os.path.join(fileroot, label, f"toy-seed{seed}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return {"gain": summary["gain_in_sft_std"], "kl": summary["kl"], "wall": summary["wall_seconds"]}


def part_learning(args) -> dict[str, list[dict]]:
    """Every run under ``--fileroot``, each under its own experiment name: a seed's SFT and reward
    phases run once (for its first run) and the others reuse them."""
    results: dict[str, list[dict]] = {}
    for seed in args.seeds:
        for algo in args.algos:
            for side in args.learn_sides:
                extra = list(SHORT_RUN) if args.smoke else []
                if side == "lora":
                    extra += [f"actor.lora.rank={args.rank}", f"actor.optimizer.lr={args.lora_lr}"]
                label = f"{algo}-{side}"
                results.setdefault(label, []).append(
                    learn(label, LEARNING_RUNS[algo], seed, args.fileroot, extra)
                )
    return results


def _mean_sd(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="timed steps per side (after one warm-up step)")
    p.add_argument("--n-seqs", type=int, default=16)
    p.add_argument("--n-mbs", type=int, default=2)
    p.add_argument("--min-len", type=int, default=32)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--algos", nargs="+", default=sorted(LEARNING_RUNS), choices=sorted(LEARNING_RUNS))
    p.add_argument("--lora-lr", type=float, default=1e-3, help="the LoRA actor's learning rate")
    p.add_argument("--skip-learning", action="store_true")
    p.add_argument("--learn-sides", nargs="+", default=list(SIDES), choices=SIDES, help="part 2's runs")
    p.add_argument("--fileroot", default="outputs/bench_lora")
    p.add_argument("--rss-side", choices=SIDES, help=argparse.SUPPRESS)
    smoke = dict(
        layers=2,
        hidden=64,
        vocab=256,
        steps=1,
        n_seqs=4,
        min_len=8,
        max_len=24,
        seeds=[1],
        algos=["grpo"],
        learn_sides=["lora"],
    )
    args = parse_args(p, None, **smoke)
    torch.set_num_threads(args.threads)
    if args.rss_side:
        print("RESULT " + json.dumps(measure_rss(args.rss_side, args)))
        return
    os.makedirs(args.fileroot, exist_ok=True)
    engine = part_engine(args)
    mib = 2**20
    print(
        f"{time.strftime('%Y-%m-%d')}: llama {args.layers} layers, hidden {args.hidden}, vocab {args.vocab} "
        f"({engine['params'] / 1e6:.1f}M parameters); LoRA rank {args.rank} on q k v o gate up down; "
        f"{args.n_seqs} sequences of {args.min_len}-{args.max_len} tokens per step, {args.threads} threads"
    )
    print(f"{'':28}{'full':>12}{'LoRA':>12}{'LoRA / full':>13}")
    rows = [
        ("parameters trained", engine["trained"], 1, "{:,.0f}"),
        ("optimizer state (MiB)", engine["optimizer_bytes"], mib, "{:.2f}"),
        ("peak RSS of a step (MiB)", engine["peak_rss_mb"], 1, "{:.0f}"),
        ("  of which the step (MiB)", engine["step_rss_mb"], 1, "{:.0f}"),
        ("step time (s, fastest)", engine["step_s"], 1, "{:.3f}"),
        (
            "moved per realloc (MiB)",
            {"full": engine["realloc"]["full"], "lora": engine["realloc"]["lora"]},
            mib,
            "{:.2f}",
        ),
    ]
    for name, values, unit, fmt in rows:
        full, lora = values["full"] / unit, values["lora"] / unit
        print(f"{name:<28}{fmt.format(full):>12}{fmt.format(lora):>12}{lora / full:>12.3f}x")
    print(
        f"(LoRA's first move into a copy carries the base too: {engine['realloc']['lora_first'] / mib:.2f} MiB; "
        "every later one the adapters alone)"
    )
    if args.skip_learning:
        return
    learning = part_learning(args)
    print(
        f"\nlearning on the sentiment task, seeds {args.seeds} (LoRA rank {args.rank} at lr {args.lora_lr:g})"
    )
    print(f"{'run':<14}{'gain (SFT std)':>18}{'KL':>16}{'RL wall s':>16}")
    for label, runs in learning.items():
        print(
            f"{label:<14}{_mean_sd([r['gain'] for r in runs]):>18}{_mean_sd([r['kl'] for r in runs]):>16}"
            f"{_mean_sd([r['wall'] for r in runs]):>16}"
        )


if __name__ == "__main__":
    main()
