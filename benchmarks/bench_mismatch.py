"""The decoder-vs-trainer log-prob mismatch on the CPU: how far the log-probs generation records
for its sampled tokens (log pi_rollout) are from the trainer's forward over the same sequences
(log pi_train), per response token l = log pi_train - log pi_rollout. Printed: the mean k1 KL
(-l), the mean k3 KL (e^l - 1 - l) and max |l|, in nats.

Two parts:

- the model API, for every registered family (dense and Mixture-of-Experts) at tiny random
  sizes: the train engine samples answers and then runs its forward over them, in fp32, in bf16
  (fp32 weights under ``torch.autocast``, how the train engine runs bf16), and decoding in bf16
  (the inference engine's module cast to bf16) against an fp32 trainer with the same weights;
- the CLI, ``grpo ppo.recompute_logprobs=true`` for 2 steps on the sentiment task, the first
  step's ``rollout_corr/*`` from stats.jsonl, in one process, tensor parallel
  (``allocation_mode=d1m2p1``), two pipeline stages (``d1m1p2``), ``actor.engine.dtype=bf16`` and
  on the Mixture-of-Experts task (``task=sentiment_moe``).

In fp32 the mismatch should be 0 or float rounding; bf16 is where it is real.

    python benchmarks/bench_mismatch.py                 # both parts
    python benchmarks/bench_mismatch.py --part model    # the model API only (seconds)
    python benchmarks/bench_mismatch.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from _smoke import SHORT_BATCHES, parse_args

import realrl.api.from_hf  # noqa: F401  (registers the families)
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.hf_family import get_hf_family, registered_hf_families
from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.backend.config import EngineConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.utils.functional import gather_packed_shifted_log_probs

VOCAB = 97
SIZES = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    sliding_window=5,  # the families with a window use it (mistral, mixtral)
    bos_token_id=0,
    eos_token_id=1,
)
# 4 experts, top-2 (every MoE family reads the names it knows and ignores the others)
MOE_SIZES = dict(
    num_local_experts=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,
)
EOS = type("Tokenizer", (), {"eos_token_id": 1})()
# (label, the decoding engine's dtype, the trainer's dtype): one engine does both when they match
PRECISIONS = [
    ("fp32", "fp32", "fp32"),
    ("bf16", "bf16", "fp32+bf16"),
    ("bf16 decode, fp32 train", "bf16", "fp32"),
]
LAYOUT_RUNS = [
    ("one process, fp32", []),
    ("tensor parallel `d1m2p1`, fp32", ["allocation_mode=d1m2p1"]),
    ("two pipeline stages `d1m1p2`, fp32", ["allocation_mode=d1m1p2"]),
    ("one process, `actor.engine.dtype=bf16`", ["actor.engine.dtype=bf16"]),
    ("MoE `task=sentiment_moe`, fp32", ["task=sentiment_moe"]),
]


def tiny_model(family: str, seed: int) -> ReaLModel:
    fam = get_hf_family(family)
    model_type = fam.hf_model_types[0]
    moe = MOE_SIZES if "moe" in model_type or model_type == "mixtral" else {}
    cfg = fam.config_from_hf(transformers.AutoConfig.for_model(model_type, **SIZES, **moe))
    torch.manual_seed(seed)
    model = ReaLModel(cfg)
    with torch.no_grad():  # a peaked distribution, as a trained model has, not a near-uniform one
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model


def mismatch(logp_train: torch.Tensor, logp_rollout: torch.Tensor) -> dict[str, float]:
    log_ratio = logp_train.double() - logp_rollout.double()
    return {
        "k1": float((-log_ratio).mean()),
        "k3": float((log_ratio.exp() - 1 - log_ratio).mean()),
        "max_abs": float(log_ratio.abs().max()),
        "tokens": int(log_ratio.numel()),
    }


def model_mismatch(family: str, decode_dtype: str, train_dtype: str, n_prompts: int, seed: int) -> dict:
    """Sample ``n_prompts`` x 4 answers of up to 16 tokens and compare the recorded log-probs with
    a forward of the trainer over the same sequences."""
    model = tiny_model(family, seed)
    train_engine_dtype = "bf16" if train_dtype == "fp32+bf16" else "fp32"
    trainer = TrainEngine(model, None, EngineConfig(dtype=train_engine_dtype))
    if decode_dtype == train_engine_dtype:
        decoder = trainer
    else:
        twin = ReaLModel(model.config)
        twin.load_state_dict(model.state_dict())
        decoder = InferenceEngine(twin, EngineConfig(dtype=decode_dtype))
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n_prompts,), generator=g).tolist()
    prompts = torch.randint(2, VOCAB, (sum(lengths),), generator=g)
    batch = SequenceSample.from_default(
        ids=list(range(n_prompts)), seqlens=lengths, data={"packed_prompts": prompts}
    )
    torch.manual_seed(seed)
    out = decoder.generate(batch, None, EOS, GenerationHyperparameters(n=4, max_new_tokens=16))
    seqs = SequenceSample.from_default(
        ids=list(range(len(out.seqlens))), seqlens=out.seqlens, data={"packed_input_ids": out.sequences}
    )
    logits = trainer.forward(seqs).float()
    cu = torch.nn.functional.pad(torch.tensor(out.seqlens).cumsum(0), (1, 0)).int()
    logp = gather_packed_shifted_log_probs(logits, cu, out.sequences)
    answer = torch.cat([torch.arange(1, n) >= p for n, p in zip(out.seqlens, out.prompt_lens)])
    return mismatch(logp[answer], out.logprobs.float()[answer])


def cli_mismatch(label: str, args: list[str], fileroot: str, seed: int, extra: list[str]) -> dict:
    """The first step's ``rollout_corr/*`` of a 2-step ``grpo ppo.recompute_logprobs=true`` run."""
    name = "mismatch-" + "".join(c if c.isalnum() else "_" for c in label).strip("_")
    cmd = [
        sys.executable,
        "-m",
        "realrl.apps.quickstart",
        "grpo",
        *args,
        "ppo.recompute_logprobs=true",
        "exp_ctrl.total_train_steps=2",
        f"fileroot={fileroot}",
        f"seed={seed}",
        f"experiment_name={name}",
        *extra,
    ]
    with open(os.path.join(fileroot, f"{name}.log"), "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed (exit {proc.returncode}); see {log.name}")
    (stats_path,) = [
        os.path.join(d, "stats.jsonl")
        for d, _, files in os.walk(os.path.join(fileroot, name))
        if "stats.jsonl" in files
    ]
    with open(stats_path) as f:
        first = json.loads(f.readline())

    def stat(key: str) -> float:
        (value,) = [v for k, v in first.items() if k.endswith(f"rollout_corr/{key}")]
        return value

    return {"k1": stat("kl"), "k3": stat("k3_kl"), "max_abs": stat("log_ratio_abs_max"), "tokens": None}


def fmt(r: dict) -> str:
    return f"{r['k1']:.2e} | {r['k3']:.2e} | {r['max_abs']:.2e}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("model", "cli", "both"), default="both")
    parser.add_argument(
        "--prompts", type=int, default=16, help="model API: prompts per family (4 answers each)"
    )
    parser.add_argument("--families", nargs="*", help="model API: these families (default: every one)")
    parser.add_argument("--layouts", nargs="*", type=int, help="CLI: these rows of the table, by index")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fileroot", default=None, help="CLI runs; default: a fresh temporary folder")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every CLI run")
    args = parse_args(parser, argv, prompts=2, families=["llama", "mixtral"], layouts=[0, 1])
    if args.smoke:
        args.extra = [*SHORT_BATCHES, *args.extra]
    if args.part in ("model", "both"):
        print("model API: l = log pi_train - log pi_rollout over the sampled answer tokens (nats)")
        print("| family | precision | mean k1 KL | mean k3 KL | max abs l | tokens |")
        print("|---|---|---|---|---|---|")
        for family in args.families or registered_hf_families():
            for label, decode_dtype, train_dtype in PRECISIONS:
                r = model_mismatch(family, decode_dtype, train_dtype, args.prompts, args.seed)
                print(f"| {family} | {label} | {fmt(r)} | {r['tokens']} |", flush=True)
    if args.part in ("cli", "both"):
        fileroot = args.fileroot or tempfile.mkdtemp(prefix="realrl-bench-mismatch-")
        os.makedirs(fileroot, exist_ok=True)
        runs = [LAYOUT_RUNS[i] for i in args.layouts] if args.layouts is not None else LAYOUT_RUNS
        print("\nCLI: `grpo ppo.recompute_logprobs=true`, the first step's rollout_corr/* (nats)")
        print("| run | mean k1 KL | mean k3 KL | max abs l |")
        print("|---|---|---|---|")
        for label, cli in runs:
            r = cli_mismatch(label, cli, fileroot, args.seed, args.extra)
            print(f"| {label} | {fmt(r)} |", flush=True)


if __name__ == "__main__":
    main()
