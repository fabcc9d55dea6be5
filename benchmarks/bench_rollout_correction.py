"""Rollout correction where the mismatch matters: GRPO on the sentiment task with a decoder that
deliberately differs from the trainer. ``ppo.mismatch_decode_temperature`` (a benchmark-only
option) makes generation sample, and record its log-probs, at another temperature than the
trainer's 1.0, so the answers come from pi_rollout = softmax(z / T) while the trainer's policy
is softmax(z): a mismatch of known size, far larger than bf16 rounding, in every token.

Arms, each per seed (the SFT phase runs once per seed and is shared):

- ``matched``: plain ``grpo``, the decoder is the trainer;
- ``mismatch``: the decoder at T, no correction (the clip anchored at the decoder's log-probs);
- ``mismatch_recompute``: ``ppo.recompute_logprobs=true``, the clip anchored at the trainer's
  log-probs, no importance weight;
- ``mismatch_token_is``: token-level truncated importance sampling,
  ``ppo.rollout_correction.rollout_is=token`` with ``rollout_is_threshold=2``.

Reported: the held-out true reward (the trained policy sampled at temperature 1.0), the KL to
the reference, and the mismatch the run measured (``rollout_corr/k3_kl`` and the mean truncated
weight, averaged over the steps, where the arm records them).

    python benchmarks/bench_rollout_correction.py --seeds 1 2 3 [--temperature 1.5]
    python benchmarks/bench_rollout_correction.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from _smoke import SHORT_RUN, parse_args
from bench_algorithms import run

IS_TOKEN = ["ppo.rollout_correction.rollout_is=token", "ppo.rollout_correction.rollout_is_threshold=2"]
# arm -> its options beside the decoder's temperature (None: no mismatch)
ARMS = {
    "matched": None,
    "mismatch": [],
    "mismatch_recompute": ["ppo.recompute_logprobs=true"],
    "mismatch_token_is": IS_TOKEN,
}


def arm_args(arm: str, temperature: float) -> list[str]:
    extra = ARMS[arm]
    if extra is None:
        return ["grpo"]
    return ["grpo", f"ppo.mismatch_decode_temperature={temperature}", *extra]


def step_mean(fileroot: str, label: str, seed: int, key: str) -> float | None:
    """``key``'s mean over the run's steps (None when the run does not record it)."""
    with open(os.path.join(fileroot, label, f"toy-seed{seed}", "stats.jsonl")) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    values = [v for s in steps for k, v in s.items() if k.endswith(key)]
    return statistics.mean(values) if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--temperature", type=float, default=1.5, help="the decoder's; the trainer's is 1.0")
    parser.add_argument("--arms", nargs="*", choices=list(ARMS), help="default: all")
    parser.add_argument("--fileroot", default=None, help="default: a fresh temporary folder")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    args = parse_args(parser, argv, seeds=[1], arms=["mismatch", "mismatch_token_is"])
    if args.smoke:
        args.extra = [*SHORT_RUN, *args.extra]
    fileroot = args.fileroot or tempfile.mkdtemp(prefix="realrl-bench-rollout-correction-")
    os.makedirs(fileroot, exist_ok=True)
    arms = args.arms or list(ARMS)
    rows = []
    for seed in args.seeds:  # seed-major: a run cut short has every arm of its first seeds
        for arm in arms:
            r = run(arm, arm_args(arm, args.temperature), seed, fileroot, "sentiment", args.extra)
            r["k3_kl"] = step_mean(fileroot, arm, seed, "rollout_corr/k3_kl")
            r["is_weight"] = step_mean(fileroot, arm, seed, "rollout_corr/rollout_is_mean")
            rows.append(r)
            keys = ("label", "seed", "sft_true_reward_mean", "true_reward_mean", "kl", "k3_kl", "is_weight")
            print(json.dumps({k: r.get(k) for k in (*keys, "wall_s")}), flush=True)
    print(
        f"\nsentiment task, decoder temperature {args.temperature:g} against the trainer's 1.0, "
        f"seeds {', '.join(map(str, args.seeds))}; mean (min..max)"
    )
    print(
        "| arm | SFT policy | after RL | KL to reference | rollout_corr/k3_kl | mean IS weight | RL wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for arm in arms:
        mine = [r for r in rows if r["label"] == arm]

        def cell(key: str, mine: list[dict] = mine) -> str:
            values = [r[key] for r in mine if r.get(key) is not None]
            if not values:
                return "-"
            return f"{statistics.mean(values):.3g} ({min(values):.3g}..{max(values):.3g})"

        keys = ("sft_true_reward_mean", "true_reward_mean", "kl", "k3_kl", "is_weight", "wall_s")
        print(f"| {arm} | " + " | ".join(cell(k) for k in keys) + " |")


if __name__ == "__main__":
    main()
