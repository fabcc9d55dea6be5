"""The checks of ``python -m realrl.apps.selfcheck``: what each runs (its command, time limit,
figures and targets), in the order they run, and which of them run on this machine.

The experiment checks run toy PPO and GRPO through ``realrl.apps.quickstart`` (the main job, its
train/rollout log-prob mismatch, two workers sharing a GPU, tensor parallelism, FSDP, per-call
layouts with reallocation); the others run the ``gpu``-marked tests and the generation (with each
Triton kernel's share of a decoding step) and forward benchmarks.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Callable, Sequence

from realrl.apps.selfcheck_report import (
    Parser,
    Target,
    parse_bench_forward,
    parse_bench_generate,
    parse_pytest,
    rollout_corr_figures,
    summary_figures,
)

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is false"

# README.md, "Benchmarks": realrl's eager decoding of the 1.1B llama on one H100 (2,538 tok/s); the
# CUDA-graph decoding's targets are 5x that and 30 % of the memory-bandwidth roofline
EAGER_H100_TOK_S = 2538
GENERATE_TARGETS = (
    Target("decode_tok_s", ">=", 5 * EAGER_H100_TOK_S, "5 x 2,538 tok/s, eager decoding on one H100"),
    Target("roofline_pct", ">=", 30.0, "30 % of the bandwidth roofline"),
)
# README.md, "What the main job does": its targets on the whole (not shortened) run
MAIN_TARGETS = (
    Target("rm_accuracy", ">=", 0.9, "RM held-out accuracy"),
    Target("gain_in_sft_std", ">=", 1.0, "PPO >= SFT mean + 1 SFT std"),
    Target("wall_seconds", "<=", 600.0, "under 10 minutes"),
)
MAIN_FIGURES = (
    "rm_accuracy",
    "sft_true_reward_mean",
    "sft_true_reward_std",
    "true_reward_mean",
    "true_reward_std",
    "gain_in_sft_std",
    "kl",
    "wall_seconds",
    "steps",
)
SHORT_FIGURES = ("steps", "wall_seconds", "true_reward_mean", "kl")
# the phases a shortened run builds on, when they are not under fileroot yet, shortened too
SHORT_PREREQUISITES = 'prerequisite_overrides=["exp_ctrl.total_train_steps=2","dataset.train_bs_n_seqs=8"]'
# the mismatch check's figures: the trainer's log-probs against the decoder's, per answer token
# l = log pi_train - log pi_rollout (rollout_correction.offpolicy_metrics): mean and max |l|, the answers'
# mean |difference of mean log-probs|, the k1 KL (mean of -l) and the k3 KL (mean of e^l - 1 - l)
MISMATCH_SHOWN = (
    "engine_dtype",
    "rollout_corr/log_ratio_abs_mean",
    "rollout_corr/log_ratio_abs_max",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "steps",
)
# the ops with a Triton kernel (realrl.impl.model.kernels.dispatch.TRITON_OPS), as
# bench_generate.py --kernel-shares names them; not imported, so that listing checks needs no torch
TRITON_KERNELS = ("rms_norm", "decode_attention")
# the decoding bench: the README's target row on CUDA, and each Triton kernel's share (the mode
# timed again with that kernel off: separate runs, so the headline's own timing is unchanged);
# on a CPU the smallest run that still times
GENERATE_ARGS = {
    "cuda": ("--device", "cuda", "--size", "1b", "--n-seqs", "64", "--min-len", "32", "--max-len", "512")
    + ("--max-new", "256", "--eos-ids", "50", "--kernel-shares"),
    "cpu": ("--device", "cpu", "--n-seqs", "4", "--min-len", "8", "--max-len", "16", "--max-new", "8")
    + ("--repeats", "1"),
}
GENERATE_HEADLINE = {"cuda": "realrl cuda_graph", "cpu": "realrl eager"}  # decoding=auto's choice
# forward + backward against transformers: the README's H100 row (1.1B llama, 16 seqs of 64-1024)
FORWARD_ARGS = ("--device", "cuda", "--size", "1b", "--n-seqs", "16", "--min-len", "64", "--max-len", "1024")


@dataclasses.dataclass(frozen=True)
class Check:
    """One check: a command run in the repository checkout with a time limit, how to read its
    figures (``parse(output, summary)``, ``summary``: the run's summary.json when ``summary_path``
    is set) and the targets they must meet."""

    name: str
    what: str
    argv: tuple[str, ...]
    timeout_s: float
    parse: Parser
    needs_cuda: bool = False
    targets: tuple[Target, ...] = ()
    summary_path: str | None = None
    requires: tuple[str, ...] = ()  # paths that must exist, else the check is skipped naming them
    shown: tuple[str, ...] = ()  # figures the table shows
    # on CUDA: GPUs it needs. Tensor parallelism and FSDP need NCCL, which refuses two workers
    # on one GPU, so their checks need a GPU per worker; everything else shares one
    gpus: int = 1

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def _from_summary(keys: Sequence[str], prefixes: Sequence[str] = ()) -> Parser:
    return lambda text, summary: summary_figures(summary, keys, prefixes)


def _generate_parser(headline: str) -> Parser:
    return lambda text, summary: parse_bench_generate(text, headline)


def _mismatch_parser(engine_dtype: str) -> Parser:
    return lambda text, summary: {
        "engine_dtype": engine_dtype,
        **summary_figures(summary, SHORT_FIGURES),
        **rollout_corr_figures(summary),
    }


def build_checks(
    device: str, repo: str, fileroot: str, quick: bool = False, engine_dtype: str = "auto"
) -> list[Check]:
    """Every check, in the order they run, for ``device`` ("cuda" or "cpu"): the experiment checks
    share ``fileroot``, so the SFT and reward-model phases the main job trains are reused by the
    later ones (each run has its own ``trial_name``). ``engine_dtype``: what the engines' default
    dtype ("auto") resolves to on ``device``, reported with the mismatch it is measured in."""
    py = sys.executable
    steps = 2 if quick else 3
    short = (
        f"exp_ctrl.total_train_steps={steps}",
        "dataset.train_bs_n_seqs=16",
        "ppo.ppo_n_minibatches=2",
        "toy_eval_prompts=64",
        SHORT_PREREQUISITES,
    )
    shared_gpu = ("colocate=true",) if device == "cuda" else ()  # two workers on the one GPU

    def quickstart(experiment: str, trial: str, *options: str) -> tuple[tuple[str, ...], str]:
        argv = (
            py,
            "-m",
            "realrl.apps.quickstart",
            experiment,
            f"device={device}",
            f"fileroot={fileroot}",
            f"trial_name=selfcheck-{trial}",
            *options,
        )
        return argv, os.path.join(fileroot, experiment, f"selfcheck-{trial}", "summary.json")

    def shortened(
        experiment: str,
        name: str,
        what: str,
        *options: str,
        prefixes: tuple[str, ...] = (),
        targets=(),
        gpus: int = 1,
        parse: Parser | None = None,
        shown: tuple[str, ...] = SHORT_FIGURES,
    ) -> Check:
        argv, summary = quickstart(experiment, name, *options, *shared_gpu, *short)
        return Check(
            name,
            what,
            argv,
            900,
            parse or _from_summary(SHORT_FIGURES, prefixes),
            targets=(Target("steps", "==", steps, "the shortened run's steps"), *targets),
            summary_path=summary,
            shown=shown,
            gpus=gpus,
        )

    # a per-call layout's check: the actor's weights moved before every generation
    actor_moved = {
        "prefixes": ("realloc/actor/",),
        "shown": (*SHORT_FIGURES, "realloc/actor/count", "realloc/actor/bytes"),
        "targets": (Target("realloc/actor/bytes", ">=", 1, "the actor's weights moved"),),
    }
    main_argv, main_summary = quickstart("ppo", "main", *(short if quick else ()))
    main_targets = (Target("steps", "==", steps, "the shortened run's steps"),) if quick else MAIN_TARGETS
    tests = os.path.join(repo, "tests")
    bench_generate = os.path.join(repo, "benchmarks", "bench_generate.py")
    bench_forward = os.path.join(repo, "benchmarks", "bench_forward.py")
    return [
        Check(
            "gpu_tests",
            "the gpu-marked tests: CUDA attention backends, decoding and CUDA graphs, the Triton "
            "kernels, engines on CUDA, and a bf16 train and inference engine sharded by FSDP2 on a "
            "one-rank NCCL group computing every matmul in bf16 (tests/backend/test_compute_dtype_gpu.py)",
            (py, "-m", "pytest", "-q", "-m", "gpu", tests),
            1200,
            parse_pytest,
            needs_cuda=True,
            requires=(tests,),
            shown=("passed", "failed", "skipped", "errors"),
        ),
        Check(
            "main",
            "the main job: SFT, reward model, PPO on the toy task" + (", shortened" if quick else ""),
            main_argv,
            900 if quick else 1800,
            _from_summary(MAIN_FIGURES),
            targets=main_targets,
            summary_path=main_summary,
            shown=(
                "rm_accuracy",
                "sft_true_reward_mean",
                "true_reward_mean",
                "gain_in_sft_std",
                "kl",
                "wall_seconds",
            ),
        ),
        # the trainer's forward (ppo.recompute_logprobs) against the decoder's log-probs of the
        # same answers, in the engines' dtype: bf16 on CUDA, where the two differ for real
        shortened(
            "ppo",
            "mismatch",
            "PPO's train/rollout log-prob mismatch in the engines' dtype, shortened",
            "ppo.recompute_logprobs=true",
            parse=_mismatch_parser(engine_dtype),
            shown=MISMATCH_SHOWN,
        ),
        shortened("grpo", "grpo_d2", "GRPO, two data-parallel workers", "allocation_mode=d2"),
        # PPO: every model it holds (actor, critic, reference, reward model) is split; GRPO's reward
        # function has no weights to split
        shortened(
            "ppo",
            "tp",
            "PPO, every model split by tensor parallelism over two workers",
            "allocation_mode=d1m2p1",
            gpus=2,
        ),
        shortened(
            "grpo",
            "fsdp",
            "GRPO, the actor sharded by FSDP2 over two workers",
            "allocation_mode=d2",
            "actor.engine.fsdp=true",
            gpus=2,
        ),
        shortened(
            "grpo",
            "per_call",
            "GRPO, the actor trains split by tensor parallelism and generates as two replicas",
            # each generation replica receives the half of the weights it lacks before every step
            # (the other way round, d2 -> m2, each rank slices its own replica: no bytes move)
            'allocation_mode="actor_train:d1m2p1,actor_gen:d2m1p1,*:d1m1p1"',
            **actor_moved,
            gpus=2,
        ),
        shortened(
            "grpo",
            "per_call_shared",
            "GRPO, the actor trains on one worker and generates as two replicas (on one GPU: both)",
            # the second replica receives the whole model before every step, through host memory
            'allocation_mode="actor_train:d1m1p1,actor_gen:d2m1p1,*:d1m1p1"',
            **actor_moved,
        ),
        Check(
            "bench_generate",
            "decoding tokens/s against transformers and the bandwidth roofline"
            + (", and each Triton kernel's share of a decoding step" if device == "cuda" else ""),
            (py, bench_generate, *GENERATE_ARGS[device]),
            900,
            _generate_parser(GENERATE_HEADLINE[device]),
            targets=GENERATE_TARGETS if device == "cuda" else (),
            requires=(bench_generate,),
            shown=(
                "decode_tok_s",
                "roofline_pct",
                "speedup_vs_hf",
                "bandwidth_gb_s",
                *(f"share_{op}" for op in TRITON_KERNELS),
            ),
        ),
        Check(
            "train_vs_hf",
            "forward + backward tokens/s, packed ReaLModel against padded transformers",
            (py, bench_forward, *FORWARD_ARGS, "--repeats", "3"),
            900,
            parse_bench_forward,
            needs_cuda=True,
            requires=(bench_forward,),
            shown=("realrl_tok_s", "hf_tok_s", "speedup_vs_hf", "realrl_peak_gib", "hf_peak_gib"),
        ),
    ]


def select_checks(
    checks: Sequence[Check],
    has_cuda: bool,
    only: Sequence[str] = (),
    skip_cpu: bool = False,
    exists: Callable[[str], bool] = os.path.exists,
    n_gpus: int | None = None,
) -> list[tuple[Check, str]]:
    """The checks to report, each with why it is skipped ("" when it runs): ``only`` keeps the
    named ones (a name that is no check is a ValueError listing them); without CUDA the GPU-only
    ones are skipped, and all with ``skip_cpu``; a check whose files are missing is skipped."""
    n_gpus = (1 if has_cuda else 0) if n_gpus is None else n_gpus
    names = [c.name for c in checks]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; the checks are {names}")
    out = []
    for check in checks:
        if only and check.name not in only:
            continue
        missing = [p for p in check.requires if not exists(p)]
        if check.needs_cuda and not has_cuda:
            why = NO_CUDA
        elif has_cuda and check.gpus > n_gpus:
            why = (
                f"needs {check.gpus} GPUs, {n_gpus} visible: tensor parallelism and FSDP need NCCL, "
                "which refuses two workers on one GPU"
            )
        elif skip_cpu and not has_cuda:
            why = "--skip-cpu on a machine without CUDA"
        elif missing:
            why = f"{missing[0]} not found: run from the repository checkout or give --repo DIR"
        else:
            why = ""
        out.append((check, why))
    return out
