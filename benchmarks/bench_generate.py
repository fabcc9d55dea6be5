"""Generation tokens/s: ReaLModel (packed prompts, KV cache, finished rows dropped) vs
transformers ``generate`` (left-padded batch, KV cache), same weights and sampling settings.

~16M-parameter llama-like model (random init), CPU, 2 threads, 32 prompts of 16-128 tokens (or
``--device cuda --size 1b``: ~1.1B parameters in bf16 on a GPU; ``--n-seqs/--min-len/--max-len``),
sampling at temperature 1 (top-k 0, top-p 1) for up to ``--max-new`` tokens. With random
weights EOS is rare; ``--eos-ids K`` makes the first K token ids all count as EOS so that
responses end at varied lengths, as in RLHF (both sides use the same EOS set).

    python benchmarks/bench_generate.py [--max-new 64] [--eos-ids 1]
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_forward import SIZES, add_model_args, build_models, make_prompts, pad_left, sync

from realrl.api.core.model_api import GenerationHyperparameters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--eos-ids", type=int, default=1, help="token ids 1..K all end a sequence")
    ap.add_argument("--repeats", type=int, default=2)
    add_model_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(2)
    ours, hf = build_models(size=args.size, device=args.device, attn_impl=args.attn_impl)
    ours.eval()
    hf.eval()
    prompts = make_prompts(args.n_seqs, args.min_len, args.max_len, vocab=SIZES[args.size]["vocab_size"])
    eos = list(range(1, args.eos_ids + 1))
    ids = torch.cat(prompts).to(args.device)
    cu = torch.zeros(len(prompts) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor([len(p) for p in prompts]).cumsum(0)
    cu = cu.to(args.device)
    pids, pmask = (t.to(args.device) for t in pad_left(prompts))

    def run_ours(max_new: int = args.max_new) -> int:
        g = GenerationHyperparameters(max_new_tokens=max_new, temperature=1.0, top_k=0, top_p=1.0)
        out = ours.generate(ids, cu, g, eos_token_id=eos)
        return sum(out.seqlens) - sum(out.prompt_lens)

    def run_hf(max_new: int = args.max_new) -> int:
        with torch.no_grad():
            out = hf.generate(
                input_ids=pids,
                attention_mask=pmask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new,
                eos_token_id=eos,
                pad_token_id=0,
            )
        resp = out[:, pids.shape[1] :]
        # count tokens up to and including the first EOS, like ReaLModel's output
        is_eos = torch.isin(resp, torch.tensor(eos, device=resp.device))
        first = torch.where(
            is_eos.any(1), is_eos.float().argmax(1) + 1, torch.full_like(resp[:, 0], resp.shape[1])
        )
        return int(first.sum())

    def timed(fn, seed: int) -> tuple[float, float, int]:
        torch.manual_seed(seed)
        t0, c0 = time.perf_counter(), time.process_time()
        n = fn()
        sync(args.device)
        return time.perf_counter() - t0, time.process_time() - c0, n

    run_ours(4), run_hf(4)  # warm-up (short: the timed runs repeat)
    best = {"ours": [0.0, 0.0], "hf": [0.0, 0.0]}  # tokens/s by wall time, by process CPU time
    counts = {"ours": 0, "hf": 0}
    for i in range(args.repeats):  # alternate, so load from other processes hits both alike
        for key, fn in (("ours", run_ours), ("hf", run_hf)):
            wall, cpu, n = timed(fn, 100 + i)
            best[key] = [max(best[key][0], n / wall), max(best[key][1], n / cpu)]
            counts[key] += n
    print(
        f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
        f"max_new_tokens={args.max_new}, {args.eos_ids} EOS id(s); "
        + (
            f"threads={torch.get_num_threads()}, {ours.attn_impl}"
            if args.device == "cpu"
            else f"{args.device} bf16, {ours.attn_impl}"
        )
    )
    print(f"{'':24s} {'wall tokens/s':>14s} {'CPU-time tokens/s':>18s} {'new tokens/run':>15s}")
    for key, label in (("ours", "ReaLModel generate"), ("hf", "transformers generate")):
        print(f"{label:24s} {best[key][0]:14.0f} {best[key][1]:18.0f} {counts[key] // args.repeats:15d}")
    print(
        f"{'ratio (ReaLModel / HF)':24s} {best['ours'][0] / best['hf'][0]:13.2f}x "
        f"{best['ours'][1] / best['hf'][1]:17.2f}x"
    )


if __name__ == "__main__":
    main()
