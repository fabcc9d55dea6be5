"""On paper: how long pushing a bf16 actor's new weights to its generation GPUs takes, beside the
refit and weight-sync times peers publish. Nothing runs on a GPU; the figures are bytes over
datasheet bandwidth at the efficiency the plan search assumes (``paper_costs.Hardware``).

    python benchmarks/paper_weight_push.py                # 7B, 32B and 70B on H100s
    python benchmarks/paper_weight_push.py --smoke        # the same table (it is arithmetic)

The model: the trainer holds the actor sharded over at least as many GPUs as one generation
replica has; every generation GPU receives its tensor-parallel slice (``bytes / tp``) from a
different trainer GPU at once, so the push takes one slice's time over one link: NVLink within a
node, the GPU's own NIC (400 Gb/s InfiniBand) across nodes. Replicas receive in parallel on their
own links. Latency per message and the trainer's own gather (FSDP's all-gather before the
sends) are left out; the second is the size of one all-gather of the model over the trainer's
GPUs (``paper_costs``'s ring formula), printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os

from _smoke import parse_args

import realrl.api.from_hf  # noqa: F401  (registers the families)
from realrl.api.core.hf_family import hf_family_for_model_type
from realrl.api.core.model_size import count_params
from realrl.apps.plan_search.paper_costs import BF16, HARDWARE

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "examples", "configs")
# (config folder, the generation replica's tensor-parallel size, the trainer's GPUs)
MODELS = (("llama-2-7b", 1, 8), ("qwen2.5-32b", 2, 8), ("llama-2-70b", 4, 16))
# what peers publish for the same job (public sources by title; H100s)
PUBLISHED = (
    "NeMo-RL refit (NVIDIA NeMo-RL documentation): 0.74-1.00 s for Qwen3-30B, 1.97-2.17 s for "
    "Qwen3.5-397B, 2.39-2.83 s for DeepSeek-V3",
    "verl weight sync (HybridFlow / verl documentation): ~8 GB/s; delta sync 11.4-14.9 s against "
    "246-266 s for a full NCCL broadcast of Qwen3-235B",
    "bucketed NCCL weight sync ~20 ms against 100-500 ms naive (a 2026 survey of 16 RL libraries)",
)


def params_of(folder: str) -> int:
    with open(os.path.join(CONFIGS, folder, "config.json")) as f:
        raw = json.load(f)
    return count_params(hf_family_for_model_type(raw["model_type"]).config_from_hf(raw)).total


def push_seconds(nbytes: float, tp: int, bandwidth: float, efficiency: float) -> float:
    """One generation GPU's slice over one link."""
    return nbytes / tp / (bandwidth * efficiency)


def gather_seconds(nbytes: float, ranks: int, bandwidth: float, efficiency: float) -> float:
    """A ring all-gather of the whole model over the trainer's ranks."""
    return (ranks - 1) / ranks * nbytes / (bandwidth * efficiency)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hardware", default="h100", choices=sorted(HARDWARE))
    args = parse_args(parser)
    hw = HARDWARE[args.hardware]
    eff = hw.comm_efficiency
    print(
        f"{hw.name}: NVLink {hw.intra_node_bandwidth / 1e9:.0f} GB/s and NIC {hw.inter_node_bandwidth / 1e9:.0f} GB/s per GPU per direction, at {eff:.0%}\n"
    )
    print(
        "| actor | bf16 GB | generation replica | push over NVLink | push over InfiniBand | trainer's all-gather first (NVLink / IB) |"
    )
    print("|---|---|---|---|---|---|")
    for folder, tp, trainers in MODELS:
        nbytes = params_of(folder) * BF16
        nv = push_seconds(nbytes, tp, hw.intra_node_bandwidth, eff)
        ib = push_seconds(nbytes, tp, hw.inter_node_bandwidth, eff)
        g_nv = gather_seconds(nbytes, min(trainers, hw.gpus_per_node), hw.intra_node_bandwidth, eff)
        g_ib = gather_seconds(nbytes, trainers, hw.inter_node_bandwidth, eff)
        print(
            f"| {folder} | {nbytes / 1e9:.1f} | TP {tp} ({nbytes / tp / 1e9:.1f} GB a GPU) | {nv * 1e3:.0f} ms | "
            f"{ib:.2f} s | {g_nv * 1e3:.0f} ms / {g_ib:.2f} s over {trainers} |"
        )
    print("\npublished:")
    for line in PUBLISHED:
        print(f"- {line}")


if __name__ == "__main__":
    main()
