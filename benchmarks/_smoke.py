"""The ``--smoke`` flag of every benchmark: the same code path end to end (build, run, measure,
report) at tiny sizes, done in seconds. Its figures mean nothing; it exists so that the default
test suite (tests/benchmarks/test_bench_smoke.py) notices when an API change breaks a script."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

HELP = (
    "tiny sizes, done in seconds: every part of the script still runs (build, run, measure, report),"
    " but the figures mean nothing; the test suite runs this. Options given explicitly still win"
)

# a PPO-family quickstart run and the phases it builds on, with batches of 8 sequences (PPO's in 2
# minibatches) and its evaluation on 32 held-out prompts (as tests/apps/test_experiments_e2e.py)
SHORT_BATCHES = (
    "dataset.train_bs_n_seqs=8",
    'prerequisite_overrides=["exp_ctrl.total_train_steps=2","dataset.train_bs_n_seqs=8"]',
    "ppo.ppo_n_minibatches=2",
    "toy_eval_prompts=32",
)
# ... and of 2 steps
SHORT_RUN = ("exp_ctrl.total_train_steps=2", *SHORT_BATCHES)


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, **smoke: Any
) -> argparse.Namespace:
    """``parser``'s arguments with ``--smoke`` added: given it, ``smoke`` replaces the defaults of
    those options (an option on the command line still wins)."""
    parser.add_argument("--smoke", action="store_true", help=HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        unknown = set(smoke) - set(vars(args))
        if unknown:
            raise ValueError(f"smoke defaults for options the parser lacks: {sorted(unknown)}")
        parser.set_defaults(**smoke)
        args = parser.parse_args(argv)
    return args
