"""Dataset loading rows/s on the embedded toy task, and ``SequenceSample.gather`` of one-sample items.

Builds the toy task (~9.5k SFT rows, ~15.7k RM rows, ~19k prompts; cached under ``--root``), then
times each registered dataset reading its JSONL file end to end (read, shard, tokenize, build one
``SequenceSample`` per row), best of ``--repeats``. ``dschat`` reads the RM rows as a
``local/jsonfile`` source, phase by phase ("2,4,4"). The gather figures are what a training step
pays to batch ``n`` items (the model worker gathers a batch per step).

    python benchmarks/bench_data.py [--root outputs/bench_data] [--repeats 3] [--threads 2]
    python benchmarks/bench_data.py --smoke   # the first 200 rows of each file, once: seconds
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import torch
from _smoke import parse_args

import realrl.impl.builtin  # noqa: F401  (registers the datasets)
from realrl.api.core.config import DatasetAbstraction
from realrl.api.core.data_api import SequenceSample, load_hf_tokenizer, make_dataset
from realrl.experiments.tasks import SENTIMENT


def best_time(fn, repeats: int) -> tuple[float, float, object]:
    """Best wall seconds of ``repeats`` runs, the CPU seconds (all threads) of that run, the result."""
    best, out = (float("inf"), 0.0), None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best[0], best[1], out


def first_rows(paths: dict[str, str], root: str, n: int) -> dict[str, str]:
    """Copies of the task's JSON-lines files holding their first ``n`` rows (the tokenizer as is)."""
    folder = os.path.join(root, f"first{n}")
    os.makedirs(folder, exist_ok=True)
    out = {}
    for key, path in paths.items():
        if not path.endswith(".jsonl"):
            out[key] = path
            continue
        out[key] = os.path.join(folder, f"{key}.jsonl")
        with open(path) as src, open(out[key], "w") as dst:
            for i, line in enumerate(src):
                if i >= n:
                    break
                dst.write(line)
    return out


def dschat_source(paths: dict[str, str], root: str) -> str:
    """A ``local/jsonfile`` copy of the toy RM rows (train.json / eval.json, JSON lines)."""
    folder = os.path.join(root, "dschat_local")
    os.makedirs(folder, exist_ok=True)
    for split, name in (("rm_train", "train.json"), ("rm_valid", "eval.json")):
        if not os.path.exists(os.path.join(folder, name)):
            shutil.copyfile(paths[split], os.path.join(folder, name))
    return folder


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="outputs/bench_data")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-rows", type=int, default=None, help="read only each file's first N rows")
    args = parse_args(ap, argv, repeats=1, max_rows=200)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))  # the Rust tokenizer's batch threads

    paths = SENTIMENT.files(args.root, 1)
    root = args.root
    if args.max_rows is not None:
        paths = first_rows(paths, args.root, args.max_rows)
        root = os.path.dirname(paths["sft_train"])
    tokenizer = load_hf_tokenizer(paths["tokenizer"])
    local = dschat_source(paths, root)
    cases = [
        ("prompt_answer", {"dataset_path": paths["sft_train"], "max_length": 1024}),
        ("rw_paired", {"dataset_path": paths["rm_train"], "max_length": 1024, "margin_key": None}),
        ("prompt", {"dataset_path": paths["ppo_train"], "max_prompt_len": 256}),
    ] + [
        (f"dschat phase {p}", {"sources": {"local/jsonfile": local}, "phase": p, "max_seq_len": 512})
        for p in (1, 2, 3)
    ]
    print(
        f"{'dataset':<16} {'items':>7} {'rows':>7} {'wall s':>8} {'cpu s':>7} {'rows/s':>9} {'rows/cpu-s':>10}"
    )
    items = {}
    for name, kw in cases:
        type_ = name.split()[0]
        secs, cpu, ds = best_time(
            lambda type_=type_, kw=kw: make_dataset(DatasetAbstraction(type_, kw), 1, 0, 1, tokenizer),
            args.repeats,
        )
        items[name] = ds
        rate, cpu_rate = ds.n_rows / secs, ds.n_rows / max(cpu, 1e-9)
        print(
            f"{name:<16} {len(ds):>7} {ds.n_rows:>7} {secs:>8.3f} {cpu:>7.3f} {rate:>9.0f} {cpu_rate:>10.0f}"
        )

    print(f"\n{'gather':<26} {'wall s':>8} {'items/s':>9}")
    for name in ("prompt_answer", "rw_paired"):
        ds = items[name]
        for n in sorted({min(n, len(ds)) for n in (64, 1024, len(ds))}):
            samples = [ds[i] for i in range(n)]
            secs, _, _ = best_time(lambda samples=samples: SequenceSample.gather(samples), args.repeats)
            print(f"{f'{name} x{n}':<26} {secs:>8.4f} {n / secs:>9.0f}")


if __name__ == "__main__":
    main()
