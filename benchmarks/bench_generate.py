"""Generation tokens/s: ReaLModel (packed prompts, KV cache; each decoding mode: the eager loop,
fixed-shape steps, CUDA graphs) vs transformers ``generate`` (left-padded batch, KV cache; with
``--hf-static`` also its static cache, which it compiles on CUDA), same weights and sampling
settings, and each against the memory-bandwidth roofline of its own run (``_roofline.py``: the
bytes of weights and KV cache a step must read, over the device bandwidth measured by a copy).

~16M-parameter llama-like model (random init), CPU, 2 threads, 32 prompts of 16-128 tokens (or
``--device cuda --size 1b``: ~1.1B parameters in bf16 on a GPU; ``--n-seqs/--min-len/--max-len``),
sampling at temperature 1 (top-k 0, top-p 1) for up to ``--max-new`` tokens. With random
weights EOS is rare; ``--eos-ids K`` makes the first K token ids all count as EOS so that
responses end at varied lengths, as in RLHF (both sides use the same EOS set).

    python benchmarks/bench_generate.py [--max-new 64] [--eos-ids 1]
    python benchmarks/bench_generate.py --device cuda --size 1b --n-seqs 64 --max-new 256 --hf-static
    python benchmarks/bench_generate.py --device cuda --size 1b --decoding cuda_graph --torch-kernels --kernel-shares
    python benchmarks/bench_generate.py --smoke   # a ~0.2M-parameter model, 4 prompts, 8 tokens: seconds

``--torch-kernels`` times each mode again with every kernel off (the torch code); ``--kernel-shares``
with one kernel off at a time: "ratio realrl M / realrl M torch rms_norm" is the RMSNorm kernel's
share, "... torch decode_attention" the decoding attention's.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import traceback

import torch
from _roofline import kv_bytes_per_token, measured_bandwidth, roofline_tokens_per_s, weight_bytes
from _smoke import parse_args
from bench_forward import SIZES, SMOKE_MODEL, add_model_args, build_models, make_prompts, pad_left, sync

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model import kernels
from realrl.impl.model.kernels.dispatch import KERNELS, TRITON_OPS


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--eos-ids", type=int, default=1, help="token ids 1..K all end a sequence")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--decoding",
        nargs="+",
        default=None,
        help="realrl's decoding modes to time (default: eager and cuda_graph on CUDA, eager and static on a CPU)",
    )
    ap.add_argument(
        "--hf-static", action="store_true", help="also transformers with a static cache (compiled on CUDA)"
    )
    ap.add_argument(
        "--torch-kernels",
        action="store_true",
        help="also each realrl mode with its own kernels off (kernels.torch_only: the torch expressions "
        "instead of the Triton RMSNorm and decoding attention on CUDA, the C kernels on a CPU)",
    )
    ap.add_argument(
        "--kernel-shares",
        action="store_true",
        help="also each realrl mode with one kernel off at a time (kernels.torch_only(op): on CUDA "
        "the Triton RMSNorm, then the Triton decoding attention; on a CPU each C kernel), so that "
        "each kernel's share of the speed is its own ratio",
    )
    ap.add_argument(
        "--bandwidth-gib",
        type=float,
        default=None,
        help="size of the buffer copied to measure the bandwidth (default: 1 on CUDA, 0.25 on a CPU)",
    )
    add_model_args(ap)
    args = parse_args(ap, argv, **SMOKE_MODEL, max_new=8, bandwidth_gib=0.01)
    torch.set_num_threads(2)
    on_cuda = torch.device(args.device).type == "cuda"
    decodings = args.decoding or (["eager", "cuda_graph"] if on_cuda else ["eager", "static"])
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
    plens = [len(p) for p in prompts]

    def realrl_runner(mode: str, torch_ops: tuple[str, ...] | None = None):
        """``torch_ops``: the kernels to turn off (``kernels.torch_only``; empty: all of them)."""

        def run(max_new: int = args.max_new) -> list[int]:
            g = GenerationHyperparameters(
                max_new_tokens=max_new, temperature=1.0, top_k=0, top_p=1.0, decoding=mode
            )
            with contextlib.nullcontext() if torch_ops is None else kernels.torch_only(*torch_ops):
                out = ours.generate(ids, cu, g, eos_token_id=eos)
            return [s - p for s, p in zip(out.seqlens, out.prompt_lens)]

        return run

    def hf_runner(**options):
        def run(max_new: int = args.max_new) -> list[int]:
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
                    **options,
                )
            resp = out[:, pids.shape[1] :]
            # tokens up to and including the first EOS, like ReaLModel's output
            is_eos = torch.isin(resp, torch.tensor(eos, device=resp.device))
            first = torch.where(
                is_eos.any(1), is_eos.float().argmax(1) + 1, torch.full_like(resp[:, 0], resp.shape[1])
            )
            return first.tolist()

        return run

    runners = {f"realrl {mode}": realrl_runner(mode) for mode in decodings}
    without: dict[str, str] = {}  # a run with kernels off -> the same mode's run with them on
    ablations = [("kernels", ())] if args.torch_kernels else []
    if args.kernel_shares:
        ablations += [(op, (op,)) for op in (TRITON_OPS if on_cuda else tuple(KERNELS))]
    for mode in decodings:
        for label, ops in ablations:
            runners[f"realrl {mode} torch {label}"] = realrl_runner(mode, ops)
            without[f"realrl {mode} torch {label}"] = f"realrl {mode}"
    runners["transformers generate"] = hf_runner()
    if args.hf_static:
        runners["transformers static cache"] = hf_runner(cache_implementation="static")

    def timed(fn, seed: int) -> tuple[float, float, list[int]]:
        torch.manual_seed(seed)
        t0, c0 = time.perf_counter(), time.process_time()
        lens = fn()
        sync(args.device)
        return time.perf_counter() - t0, time.process_time() - c0, lens

    skipped = {}
    for name, fn in list(runners.items()):  # warm-up (short: the timed runs repeat)
        try:
            fn(4)
        except Exception as e:  # noqa: BLE001 - a peer's path that does not run here: say why
            traceback.print_exc()  # the whole story on stderr; the table gets its first line
            skipped[name] = f"{type(e).__name__}: {e}".splitlines()[0][:120]
            del runners[name]
    best = {k: [0.0, 0.0] for k in runners}  # tokens/s by wall time, by process CPU time
    lens_of: dict[str, list[int]] = {}
    for i in range(args.repeats):  # alternate, so load from other processes hits all alike
        for name, fn in runners.items():
            wall, cpu, lens = timed(fn, 100 + i)
            n = sum(lens)
            best[name] = [max(best[name][0], n / wall), max(best[name][1], n / cpu)]
            lens_of[name] = lens

    gib = args.bandwidth_gib or (1.0 if on_cuda else 0.25)
    bandwidth = measured_bandwidth(args.device, gib=gib)
    weights = weight_bytes(ours)
    cfg = ours.config
    kv = kv_bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, ours.dtype)
    print(
        f"{len(prompts)} prompts of {min(plens)}-{max(plens)} tokens, max_new_tokens={args.max_new}, "
        f"{args.eos_ids} EOS id(s); "
        + (f"threads={torch.get_num_threads()}" if not on_cuda else f"{args.device} bf16")
        + f", attention {ours.attn_impl}; weights {weights / 2**30:.2f} GiB, measured bandwidth "
        f"{bandwidth / 1e9:.0f} GB/s"
    )
    width = max(28, *(len(name) for name in [*runners, *skipped]))  # the names' column
    print(
        f"{'':{width}s} {'wall tokens/s':>14s} {'CPU-time tokens/s':>18s} {'new tokens/run':>15s} "
        f"{'roofline tokens/s':>18s} {'of roofline':>12s}"
    )
    for name in runners:
        roof = roofline_tokens_per_s(plens, lens_of[name], weights, kv, bandwidth)
        print(
            f"{name:{width}s} {best[name][0]:14.0f} {best[name][1]:18.0f} {sum(lens_of[name]):15d} "
            f"{roof:18.0f} {best[name][0] / roof:11.1%}"
        )
    for name, why in skipped.items():
        print(f"{name:{width}s} did not run: {why}")
    base = "transformers generate"
    for name in runners:
        if name != base:
            print(
                f"{'ratio ' + name + ' / ' + base:{2 * width + 10}s} {best[name][0] / best[base][0]:6.2f}x wall"
            )
    for name, own in without.items():
        if name in runners and own in runners:
            print(
                f"{'ratio ' + own + ' / ' + name:{2 * width + 10}s} {best[own][0] / best[name][0]:6.2f}x wall"
            )
    if "realrl eager" in runners:
        for name in runners:
            if name.startswith("realrl") and name != "realrl eager" and name not in without:
                print(
                    f"{'ratio ' + name + ' / realrl eager':{2 * width + 10}s} {best[name][0] / best['realrl eager'][0]:6.2f}x wall"
                )


if __name__ == "__main__":
    main()
