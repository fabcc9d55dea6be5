"""The plan of work a profiled search prints before anything runs: the prerequisite phases it
builds (or reuses), the profiles it runs (or reads from the cache), the contention run, the search
itself and the plans it runs briefly, each with its estimated seconds, and their total next to
the time limit (``budget.py``), so that a search of minutes says so up front.

Estimates, and they are only that: a short run takes what the short runs of earlier searches
took on this machine (the cost table keeps their median), else ``budget.DEFAULT_RUN_S``; a
phase takes its steps (its epochs times its data file's lines over the batch, at most
``total_train_steps``) at ``PHASE_STEP_S`` each plus ``PHASE_START_S``: a toy model's pace on 2
CPU cores, a guess for anything larger.
"""

from __future__ import annotations

import dataclasses
import math
import os

from realrl.api.quickstart.base import CommonExperimentConfig

PHASE_STEP_S = 0.12  # a toy SFT or reward-model step on 2 CPU cores (batches of 64, measured)
PHASE_START_S = 20.0  # its workers started, its model built, its checkpoint written
SIMULATE_S = 0.05  # one plan simulated and memory-checked (the toy PPO on 2 busy CPU cores)


@dataclasses.dataclass
class Work:
    """What the search is about to do, and how long it guesses each part takes."""

    phases: list[tuple[str, CommonExperimentConfig]]  # prerequisite phases to build, in order
    profiles: list[str]  # layouts to profile
    cached_profiles: int  # layouts the cache already costs
    move: str | None  # the plan whose run measures a move of weights (None: measured, or none)
    contention: bool  # whether a contention run may come
    plans: int  # plans in the space (every one simulated when few, else a Metropolis walk)
    exhaustive: bool
    verify: int  # plans run briefly, at most
    run_s: float  # a short run's estimated seconds
    timed: bool  # whether run_s was timed on this machine (else the default)
    limit_s: float | None

    def lines(self) -> list[str]:
        """The plan of work, one line per part, then the total against the limit."""
        limit = "no time limit" if self.limit_s is None else f"time limit {self.limit_s:g} s"
        source = "timed by earlier searches here" if self.timed else "a default; no run timed here yet"
        out = [f"plan of work (seconds are estimates; a short run ~{self.run_s:.0f} s, {source}; {limit}):"]
        before = 0.0
        for name, cfg in self.phases:
            steps, seconds = phase_estimate(cfg)
            before += seconds
            count = "steps unknown" if steps is None else f"{steps} steps"
            out.append(
                f"  prerequisite {name} phase: build ({count}), ~{_t(seconds)}, outside the time limit"
            )
        if not self.phases:
            out.append("  prerequisites: none to build (checkpoints reused or none needed)")
        runs = len(self.profiles) + (self.move is not None)
        listed = ", ".join(self.profiles) or "none"
        out.append(
            f"  profiles: {len(self.profiles)} to run ({listed}), {self.cached_profiles} cached"
            + (f", and a move of weights ({self.move})" if self.move else "")
            + f": ~{_t(runs * self.run_s)}"
        )
        if self.contention:
            out.append(f"  contention: 1 run if the best plan computes calls side by side: ~{_t(self.run_s)}")
        search_s = SIMULATE_S * self.plans
        if not self.exhaustive:
            how = f"a Metropolis walk of {self.plans} proposals"
        elif self.limit_s is None or search_s <= self.limit_s:
            how = f"every one of {self.plans} plans"
        else:  # too many to score them all in the limit: the walk instead (search.py)
            how = f"{self.plans} plans, too many for the limit: a Metropolis walk"
        out.append(f"  search: {how}: ~{_t(search_s)}, or what the time left allows")
        if self.verify:
            out.append(
                f"  verification: up to {self.verify} plans run briefly (plans run before are reused): "
                f"~{_t(self.verify * self.run_s)}"
            )
        after = (runs + self.contention + self.verify) * self.run_s + search_s
        fits = ""
        if self.limit_s is not None and after > self.limit_s:
            fits = f"; over the limit: the runs that do not fit in {self.limit_s:g} s are skipped"
        out.append(f"  total: ~{_t(before + after)} (~{_t(after)} after the prerequisites{fits})")
        return out


def phase_estimate(cfg: CommonExperimentConfig) -> tuple[int | None, float]:
    """A prerequisite phase's steps (None: its data file is not readable) and estimated seconds."""
    steps = phase_steps(cfg)
    return steps, PHASE_START_S + PHASE_STEP_S * (steps or 0)


def phase_steps(cfg: CommonExperimentConfig) -> int | None:
    """Epochs times the batches in the phase's training file (a line a sample), capped by
    ``total_train_steps``; None when the file cannot be read (or not counted in lines)."""
    dataset = getattr(cfg, "dataset", None)
    path = getattr(dataset, "train_path", "") or getattr(dataset, "path", "")
    batch = getattr(dataset, "train_bs_n_seqs", 0)
    cap = cfg.exp_ctrl.total_train_steps
    if not (path and batch and os.path.isfile(path)):
        return cap
    with open(path, "rb") as f:
        lines = sum(1 for _ in f)
    steps = cfg.exp_ctrl.total_train_epochs * math.ceil(lines / batch)
    return min(steps, cap) if cap else steps


def _t(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
