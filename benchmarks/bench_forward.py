"""Forward+backward tokens/s: ReaLModel on packed sequences vs transformers on a padded batch.

Same weights (a llama-like model, random init), 32 sequences of 16-128 tokens. "Tokens" are real
(non-pad) tokens for both, so the ratio is useful work per second. By default a ~16M-parameter
model on CPU with 2 threads; ``--device cuda --size 1b`` runs a ~1.1B-parameter model in bf16 on a
GPU (ReaLModel picks its CUDA varlen kernel, transformers its sdpa on the padded batch), and
``--n-seqs/--min-len/--max-len`` set the batch. ``--compile`` adds a third side: the same
ReaLModel with its blocks through ``torch.compile`` (``ReaLModel.compile_blocks``, what
``engine.compile=on`` runs), timed after its one-off compilation, which is printed apart.

    python benchmarks/bench_forward.py [--repeats 3] [--device cuda --size 1b --max-len 1024] [--compile]
    python benchmarks/bench_forward.py --smoke   # a ~0.2M-parameter model, 4 short sequences: seconds
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

import torch
import transformers
from _smoke import parse_args

from realrl.api.core.model_api import ReaLModelConfig
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

SIZES = {
    "micro": dict(  # what --smoke runs: seconds on a CPU
        n_layers=2,
        n_q_heads=4,
        n_kv_heads=2,
        hidden_dim=64,
        intermediate_dim=176,
        vocab_size=1000,
        n_positions=512,
    ),
    "tiny": dict(
        n_layers=6,
        n_q_heads=6,
        n_kv_heads=2,
        hidden_dim=384,
        intermediate_dim=1024,
        vocab_size=8000,
        n_positions=512,
    ),
    "1b": dict(  # TinyLlama-1.1B's shape
        n_layers=22,
        n_q_heads=32,
        n_kv_heads=4,
        hidden_dim=2048,
        intermediate_dim=5632,
        vocab_size=32000,
        n_positions=4096,
    ),
}
CONFIG = SIZES["tiny"]
# --smoke: the model and batch of the smallest run that still goes through every step
SMOKE_MODEL = {"size": "micro", "n_seqs": 4, "min_len": 8, "max_len": 16, "repeats": 1}


def add_model_args(ap: argparse.ArgumentParser, n: int = 32, lo: int = 16, hi: int = 128) -> None:
    ap.add_argument("--device", default="cpu", help="cpu (fp32, 2 threads) or cuda (bf16)")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--n-seqs", type=int, default=n)
    ap.add_argument("--min-len", type=int, default=lo)
    ap.add_argument("--max-len", type=int, default=hi)
    ap.add_argument(
        "--attn-impl", default="auto", help="realrl's attention backend (auto, sdpa, cpu_varlen, ...)"
    )


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def build_models(
    seed: int = 0, size: str = "tiny", device: str = "cpu", attn_impl: str = "auto"
) -> tuple[ReaLModel, transformers.PreTrainedModel]:
    """The same random llama-like weights as a ReaLModel and as a transformers model."""
    torch.manual_seed(seed)
    on_cuda = torch.device(device).type == "cuda"
    dtype = torch.bfloat16 if on_cuda else torch.float32
    config = ReaLModelConfig(**SIZES[size], eos_token_id=1, bos_token_id=0)
    with tempfile.TemporaryDirectory() as d:
        ReaLModel(config, attn_impl="sdpa").save_pretrained(os.path.join(d, "m"))
        ours = ReaLModel.from_pretrained(
            os.path.join(d, "m"), dtype=dtype, device=device, attn_impl=attn_impl
        )
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.join(d, "m"), dtype=dtype, attn_implementation="sdpa"
        ).to(device)
    return ours, hf


def make_prompts(
    n: int = 32, lo: int = 16, hi: int = 128, seed: int = 1, vocab: int = CONFIG["vocab_size"]
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(2, vocab, (L,), generator=g) for L in lens]


def pad_left(seqs: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s) :] = s
        mask[i, L - len(s) :] = 1
    return ids, mask


def best_times(fns: list, repeats: int, device: str = "cpu") -> list[tuple[float, float]]:
    """(best wall seconds, best process CPU seconds) of each function, alternating them so that
    load from other processes on a shared machine hits both sides alike. CPU seconds are the
    steadier figure when the machine is shared (wall time then includes waiting for a core)."""
    for fn in fns:
        fn()  # warm-up
    sync(device)
    wall = [float("inf")] * len(fns)
    cpu = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            wall[i] = min(wall[i], time.perf_counter() - t0)
            cpu[i] = min(cpu[i], time.process_time() - c0)
    return list(zip(wall, cpu))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="add ReaLModel with compiled blocks")
    add_model_args(ap)
    args = parse_args(ap, argv, **SMOKE_MODEL)
    torch.set_num_threads(2)
    ours, hf = build_models(size=args.size, device=args.device, attn_impl=args.attn_impl)
    ours.train()
    hf.train()
    seqs = make_prompts(args.n_seqs, args.min_len, args.max_len, vocab=SIZES[args.size]["vocab_size"])
    n_tokens = sum(len(s) for s in seqs)
    ids = torch.cat(seqs).to(args.device)
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor([len(s) for s in seqs]).cumsum(0)
    cu = cu.to(args.device)
    pids, pmask = (t.to(args.device) for t in pad_left(seqs))

    def packed_step(model: ReaLModel):
        def step():
            logits = model(ids, cu)
            loss = -gather_packed_shifted_log_probs(logits.float(), cu, ids).mean()
            loss.backward()
            model.zero_grad(set_to_none=True)

        return step

    ours_step = packed_step(ours)

    def hf_step():
        pos = (pmask.cumsum(-1) - 1).clamp(min=0)
        logits = hf(input_ids=pids, attention_mask=pmask, position_ids=pos).logits.float()
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, pids[:, 1:, None]).squeeze(-1)
        m = pmask[:, 1:].float() * pmask[:, :-1].float()
        loss = -(logp * m).sum() / m.sum()
        loss.backward()
        hf.zero_grad(set_to_none=True)

    n_params = sum(p.numel() for p in ours.parameters())
    peaks = []
    for step in (ours_step, hf_step):
        if args.device != "cpu":
            torch.cuda.reset_peak_memory_stats()
        step()
        peaks.append(torch.cuda.max_memory_allocated() / 2**30 if args.device != "cpu" else 0.0)
    (w_ours, c_ours), (w_hf, c_hf) = best_times([ours_step, hf_step], args.repeats, args.device)
    compiled = None
    if args.compile:  # the same weights, its blocks compiled on the first step (timed apart)
        twin = copy.deepcopy(ours)
        blocks = twin.compile_blocks()
        start = time.perf_counter()
        packed_step(twin)()
        sync(args.device)
        compile_s = time.perf_counter() - start
        ((w_comp, c_comp),) = best_times([packed_step(twin)], args.repeats, args.device)
        compiled = (w_comp, c_comp, compile_s, blocks.stats()["compile/graphs"])
    where = (
        f"threads={torch.get_num_threads()}, {ours.attn_impl}"
        if args.device == "cpu"
        else f"{args.device} bf16, {ours.attn_impl}"
    )
    print(
        f"model: llama-like, {n_params / 1e6:.1f}M params; {len(seqs)} sequences, {n_tokens} tokens "
        f"(padded batch {pids.numel()} slots); {where}"
    )
    if args.device != "cpu":
        print(f"peak GPU memory of a step: ReaLModel {peaks[0]:.2f} GiB, HF {peaks[1]:.2f} GiB")
    print(f"{'':30s} {'wall tokens/s':>14s} {'CPU-time tokens/s':>18s}")
    print(f"{'ReaLModel packed fwd+bwd':30s} {n_tokens / w_ours:14.0f} {n_tokens / c_ours:18.0f}")
    print(f"{'transformers padded fwd+bwd':30s} {n_tokens / w_hf:14.0f} {n_tokens / c_hf:18.0f}")
    print(f"{'ratio (ReaLModel / HF)':30s} {w_hf / w_ours:13.2f}x {c_hf / c_ours:17.2f}x")
    if compiled is not None:
        w_comp, c_comp, compile_s, graphs = compiled
        print(f"{'ReaLModel compiled fwd+bwd':30s} {n_tokens / w_comp:14.0f} {n_tokens / c_comp:18.0f}")
        print(f"{'ratio (compiled / ReaLModel)':30s} {w_ours / w_comp:13.2f}x {c_ours / c_comp:17.2f}x")
        print(f"{'ratio (compiled / HF)':30s} {w_hf / w_comp:13.2f}x {c_hf / c_comp:17.2f}x")
        print(f"one-off compile: {compile_s:.1f} s (first step, {graphs:.0f} graphs)")


if __name__ == "__main__":
    main()
