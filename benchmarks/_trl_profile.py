"""Where a realrl step goes (for ``bench_vs_trl.py``): the same training step timed in-process,
without the runtime, next to the equivalent padded HF step, plus a cProfile of realrl's step.

    python benchmarks/_trl_profile.py [--fileroot DIR] [--iters 6] [--top 25]
    python benchmarks/_trl_profile.py --smoke   # 8 pairs, 1 timed step: seconds

Compare with the step times of ``bench_vs_trl.py``: run step - in-process step = runtime overhead
(master round trips, data transfer, stats); in-process realrl step vs HF step = engine + model.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _smoke import parse_args  # noqa: E402
from _trl_common import BenchSpec, prepare  # noqa: E402


def interleaved_times(fns: dict, iters: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of each ``fn()``, calls interleaved (so load from other
    processes hits all alike), after one warm-up call each."""
    for fn in fns.values():
        fn()
    walls: dict[str, list[float]] = {k: [] for k in fns}
    cpus: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            w, c = time.perf_counter(), time.process_time()
            fn()
            walls[name].append(time.perf_counter() - w)
            cpus[name].append(time.process_time() - c)
    return {k: (statistics.median(walls[k]), statistics.median(cpus[k])) for k in fns}


def realrl_rw_step(spec: BenchSpec, paths: dict[str, str]):
    """paired_rw.train_step on a TrainEngine over 64 pairs of the RM data: what the worker runs."""
    import realrl.impl.builtin  # noqa: F401  (the model, backend and interface by name)
    from realrl.api.core.config import ModelAbstraction, ModelBackendAbstraction, ModelInterfaceAbstraction
    from realrl.api.core.model_api import FinetuneSpec, make_backend, make_interface, make_model
    from realrl.experiments.toy_eval import load_batch

    args = {"path": paths["init_rm"], "is_critic": True, "tokenizer_path": paths["tokenizer"]}
    model = make_model(ModelAbstraction("real_model", args), "default")
    opt = {"lr": spec.rw_lr, "betas": (0.9, spec.beta2), "eps": spec.adam_eps, "grad_clip": spec.grad_clip}
    backend = ModelBackendAbstraction("train", {"optimizer": opt, "engine": {"dtype": "fp32"}})
    model = make_backend(backend).initialize(model, FinetuneSpec(1, 100 * spec.rw_pairs, spec.rw_pairs))
    iface = make_interface(ModelInterfaceAbstraction("paired_rw"))
    batch = load_batch(
        "rw_paired",
        {"dataset_path": paths["rm_train"], "max_pairs_per_prompt": 1, "max_length": spec.max_seqlen},
        model.tokenizer,
        limit=spec.rw_pairs,
        seed=spec.seed,
    )
    return lambda: iface.train_step(model, batch), batch


def hf_rw_step(spec: BenchSpec, paths: dict[str, str], batch):
    """The same pairs padded into one [128, L] batch through LlamaForSequenceClassification."""
    import torch.nn.functional as F
    from _trl_hf import load_reward_model

    model = load_reward_model(paths["init_rm"]).train()
    pad = model.config.pad_token_id
    seqs = torch.split(
        batch.data["packed_input_ids"], [n for s in batch.seqlens["packed_input_ids"] for n in s]
    )
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    opt = torch.optim.AdamW(
        model.parameters(), lr=spec.rw_lr, betas=(0.9, spec.beta2), eps=spec.adam_eps, weight_decay=0.0
    )

    def step():
        r = model(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
        loss = -F.logsigmoid(r[0::2] - r[1::2]).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        opt.zero_grad()

    return step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fileroot", default="outputs/bench_vs_trl")
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parse_args(parser, argv, iters=1, top=5, threads=1)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = BenchSpec.sized(args.fileroot, args.smoke)
    paths = prepare(spec)
    real_step, batch = realrl_rw_step(spec, paths)
    hf_step = hf_rw_step(spec, paths, batch)
    print(f"load average: {os.getloadavg()}, torch threads: {torch.get_num_threads()}")
    times = interleaved_times(
        {"realrl paired_rw.train_step": real_step, "HF padded step": hf_step}, args.iters
    )
    for name, (wall, cpu) in times.items():
        print(f"{name:32s} wall {wall:.4f} s  cpu {cpu:.4f} s")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        real_step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
