"""Training throughput: realrl's TrainEngine on packed micro-batches vs a padded HF loop.

Both sides train the same llama config (ReaLModel vs transformers' LlamaForCausalLM) from the same
weights on the same mixed-length data with the same AdamW settings and the same number of
micro-batches per step; the HF loop pads each micro-batch to its longest sequence (the usual
``DataCollatorWithPadding`` recipe) and weights micro-batch losses by their token counts, so
both compute the same loss (the first-step losses are printed side by side).

Throughput is timed in one process with the two sides' steps interleaved, so load from other
processes hits both alike, and reported from the fastest step (wall-clock, and CPU time, which
other load disturbs less). Peak RSS is measured in one subprocess per side, over a training step
after a warm-up step.

    python benchmarks/bench_train.py [--steps 5] [--n-seqs 32] [--threads 1] [--min-len 16] [--max-len 384]
    python benchmarks/bench_train.py --smoke   # 1 timed step of 4 short sequences: seconds

``--compile`` adds a third side, the same TrainEngine with ``engine.compile=on`` (its blocks
through ``torch.compile``, Inductor's cache in a fresh folder, so cold), printed beside the eager
one with the ratio and the one-off compile seconds (the warm-up step's ``compile/seconds``); its
peak RSS is not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from _smoke import parse_args
from _step_memory import step_peak_rss

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 2048, 128, 2, 4, 2, 344
LR, BETAS, EPS, CLIP = 1e-4, (0.9, 0.95), 1e-5, 1.0


def model_config():
    from realrl.api.core.model_api import ReaLModelConfig

    return ReaLModelConfig(
        n_layers=LAYERS,
        n_q_heads=HEADS,
        n_kv_heads=KV_HEADS,
        hidden_dim=HIDDEN,
        intermediate_dim=FFN,
        vocab_size=VOCAB,
        n_positions=4096,
    )


def make_lengths(args) -> list[int]:
    g = torch.Generator().manual_seed(args.seed)
    return torch.randint(args.min_len, args.max_len + 1, (args.n_seqs,), generator=g).tolist()


def make_step_data(args, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in make_lengths(args)]


def hf_chunks(items: list, n_mbs: int) -> list[list]:
    """Contiguous micro-batches of equal sequence counts (what a padded DataLoader gives)."""
    k = -(-len(items) // n_mbs)
    return [items[i : i + k] for i in range(0, len(items), k)]


def real_trainer(ckpt: str, args, compile: str = "off", stats: dict | None = None) -> Callable:
    """The TrainEngine's step; ``stats`` (when given) receives the last step's statistics."""
    from realrl.api.core.data_api import MicroBatchSpec, SequenceSample
    from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
    from realrl.impl.model.backend.train_engine import TrainEngine
    from realrl.impl.model.nn import ReaLModel
    from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

    opt = OptimizerConfig(lr=LR, betas=BETAS, eps=EPS, grad_clip=CLIP)
    cache = os.path.join(ckpt, ".inductor_cache")  # a fresh folder: the compilation is timed cold
    config = EngineConfig(dtype="fp32", compile=compile, compile_cache_dir=cache)
    engine = TrainEngine(ReaLModel.from_pretrained(ckpt), opt, config, args.steps + 1)

    def loss_fn(logits, mb):  # mean next-token NLL over the micro-batch's predictions
        ids = mb.data["packed_input_ids"]
        return -gather_packed_shifted_log_probs(logits, mb.cu_seqlens("packed_input_ids"), ids).mean(), {}

    def n_predictions(mb):
        return float(sum(n - 1 for n in mb.flat_seqlens("packed_input_ids")))

    def step(seqs: list[torch.Tensor], version: int) -> float:
        batch = SequenceSample.from_default(
            ids=list(range(len(seqs))),
            seqlens=[len(s) for s in seqs],
            data={"packed_input_ids": torch.cat(seqs)},
        )
        mb_spec = MicroBatchSpec(n_mbs=args.n_mbs)
        out = engine.train_batch(batch, mb_spec, loss_fn, n_predictions, version_steps=version)
        if stats is not None:
            stats.update(out)
        return out["loss"]

    return step


def hf_trainer(ckpt: str, args) -> Callable[[list[torch.Tensor], int], float]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS)

    def step(seqs: list[torch.Tensor], version: int) -> float:
        total = sum(len(s) - 1 for s in seqs)
        step_loss = 0.0
        for chunk in hf_chunks(seqs, args.n_mbs):
            longest = max(len(s) for s in chunk)
            ids = torch.zeros(len(chunk), longest, dtype=torch.long)
            mask = torch.zeros(len(chunk), longest, dtype=torch.long)
            for i, s in enumerate(chunk):
                ids[i, : len(s)], mask[i, : len(s)] = s, 1
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
            weight = sum(len(s) - 1 for s in chunk) / total
            (loss * weight).backward()
            step_loss += float(loss.detach()) * weight
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return step_loss

    return step


TRAINERS = {"realrl": real_trainer, "hf": hf_trainer}


def measure_rss(side: str, ckpt: str, args) -> dict:
    """In a fresh process: the RSS before a training step and the peak RSS during it, after a
    warm-up step (``_step_memory.step_peak_rss``)."""
    step = TRAINERS[side](ckpt, args)
    return step_peak_rss(lambda: step(make_step_data(args, 0), 0), lambda: step(make_step_data(args, 1), 1))


def print_compiled(tps: dict, cpu_tps: dict, first_loss: dict, stats: dict) -> None:
    """The compiled TrainEngine beside the eager one."""
    print(f"first-step loss: compiled {first_loss['compiled']:.5f}  eager {first_loss['realrl']:.5f}")
    print(
        f"{'realrl TrainEngine eager':28s} {tps['realrl']:8.0f} tokens/s ({cpu_tps['realrl']:.0f} per CPU-second)"
    )
    print(
        f"{'realrl TrainEngine compiled':28s} {tps['compiled']:8.0f} tokens/s "
        f"({cpu_tps['compiled']:.0f} per CPU-second)"
    )
    print(
        f"compile ratio compiled / eager: {tps['compiled'] / tps['realrl']:.2f}x wall-clock, "
        f"{cpu_tps['compiled'] / cpu_tps['realrl']:.2f}x CPU time; one-off compile "
        f"{stats['compile/seconds']:.1f} s ({stats['compile/graphs']:.0f} graphs)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5, help="timed steps per side (after one warm-up step)")
    p.add_argument("--n-seqs", type=int, default=32)
    p.add_argument("--n-mbs", type=int, default=4)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    p.add_argument("--compile", action="store_true", help="add the TrainEngine with engine.compile=on")
    p.add_argument("--rss-side", choices=sorted(TRAINERS), help=argparse.SUPPRESS)
    p.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = parse_args(p, None, steps=1, n_seqs=4, n_mbs=2, min_len=8, max_len=32)
    torch.set_num_threads(args.threads)
    if args.rss_side:
        print("RESULT " + json.dumps(measure_rss(args.rss_side, args.ckpt, args)))
        return

    from realrl.impl.model.nn import ReaLModel

    t_start = time.perf_counter()
    lengths = make_lengths(args)
    with tempfile.TemporaryDirectory() as ckpt:
        torch.manual_seed(args.seed)
        ReaLModel(model_config()).save_pretrained(ckpt)  # one set of weights for both sides
        steps = {side: make(ckpt, args) for side, make in TRAINERS.items()}
        compile_stats: dict = {}
        if args.compile:
            steps["compiled"] = real_trainer(ckpt, args, "on", compile_stats)
        wall = {side: [] for side in steps}
        cpu = {side: [] for side in steps}
        first_loss = {}
        for i in range(args.steps + 1):  # step 0 warms up
            seqs = make_step_data(args, i)
            for side, step in steps.items():
                w0, c0 = time.perf_counter(), time.process_time()
                loss = step(seqs, i)
                if i:
                    wall[side].append(time.perf_counter() - w0)
                    cpu[side].append(time.process_time() - c0)
                first_loss.setdefault(side, loss)
        rss = {}
        for side in TRAINERS:
            cmd = [sys.executable, __file__, *sys.argv[1:], "--rss-side", side, "--ckpt", ckpt]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rss[side] = json.loads(out.split("RESULT ", 1)[1])

    # the fastest step: load from other processes only ever slows a step down
    tps = {side: sum(lengths) / min(t) for side, t in wall.items()}
    cpu_tps = {side: sum(lengths) / min(t) for side, t in cpu.items()}
    padded = sum(len(c) * max(c) for c in hf_chunks(lengths, args.n_mbs))
    print(
        f"config: llama {LAYERS} layers, hidden {HIDDEN}, vocab {VOCAB}; {args.n_seqs} seqs/step of "
        f"{args.min_len}-{args.max_len} tokens (mean {sum(lengths) / len(lengths):.0f}), {args.n_mbs} "
        f"micro-batches, {args.steps} timed steps, {args.threads} threads, fp32 CPU"
    )
    print(
        f"HF padding: {padded} padded tokens for {sum(lengths)} real ({1 - sum(lengths) / padded:.0%} waste)"
    )
    print(
        f"first-step loss: realrl {first_loss['realrl']:.5f}  hf {first_loss['hf']:.5f} (same weights, data)"
    )
    for side, name in (("realrl", "realrl TrainEngine (packed)"), ("hf", "HF padded loop")):
        r = rss[side]
        print(
            f"{name:28s} {tps[side]:8.0f} tokens/s ({cpu_tps[side]:.0f} per CPU-second)   peak RSS {r['peak_rss']:6.0f} MiB "
            f"(+{r['peak_rss'] - r['rss_before']:.0f} MiB during a step)"
        )
    grow = {s: rss[s]["peak_rss"] - rss[s]["rss_before"] for s in rss}
    print(
        f"throughput ratio realrl / hf: {tps['realrl'] / tps['hf']:.2f}x wall-clock, "
        f"{cpu_tps['realrl'] / cpu_tps['hf']:.2f}x CPU time"
    )
    print(
        f"peak RSS ratio realrl / hf: {rss['realrl']['peak_rss'] / rss['hf']['peak_rss']:.2f} "
        f"(growth during a step: {grow['realrl'] / max(grow['hf'], 1.0):.2f})"
    )
    if args.compile:
        print_compiled(tps, cpu_tps, first_loss, compile_stats)
    print(f"wall time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
