"""Search the execution plans of an experiment: every call's placement, scored by the simulator.

Where the space is small (at most ``exhaustive_limit`` plans) every plan is simulated. Beyond,
a Metropolis search ("ReaL: Efficient RLHF Training of Large Language Models with Parameter
Reallocation" searches its plans by MCMC too) starts from the best plan that uses one layout for
every call, changes one call's placement at a time, keeps a better plan always and a worse one
with probability exp(-(t_new - t_old) / (temperature * t_old)), and stops after ``iterations``
proposals (or ``time_limit`` seconds, whichever comes first). With a seed and no time limit
reached, the result is the same on every machine. Plans the runtime refuses, or whose memory
plan exceeds the device, are reported as rejected with the reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from collections.abc import Callable

from realrl.api.core.layout import Placement
from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.plan_space import Plan, call_options, with_allocation
from realrl.system.simulator import Costs, Simulation, simulate


@dataclasses.dataclass
class Candidate:
    allocation_mode: str
    simulation: Simulation
    peak_bytes: int | None  # the largest worker's planned peak memory (None: not planned)


@dataclasses.dataclass
class SearchResult:
    ranked: list[Candidate]  # best first
    rejected: list[tuple[str, str]]  # (allocation_mode, why)
    evaluated: int
    exhaustive: bool
    seconds: float


class NoFeasiblePlan(ValueError):
    """Every plan of the space was refused or does not fit."""


def search(
    exp: ExperimentConfig,
    costs: Costs,
    n_workers: int,
    memory: Callable[[ExperimentConfig], int] | None = None,
    limit_bytes: int | None = None,
    seed: int = 1,
    exhaustive_limit: int = 20_000,
    iterations: int = 3_000,
    time_limit: float | None = None,
    temperature: float = 0.05,
    steps: int = 16,
) -> SearchResult:
    """The plans of ``exp`` on ``n_workers`` workers, best (shortest simulated step) first.
    ``memory(plan's config)``: its largest worker's peak bytes, checked against ``limit_bytes``."""
    start = time.monotonic()
    options = [call_options(m, n_workers) for m in exp.mfcs]
    scored: dict[str, Candidate | None] = {}
    rejected: dict[str, str] = {}

    def score(choice: tuple[Placement, ...]) -> Candidate | None:
        used = {w for p in choice for w in p.workers}
        if used != set(range(max(used) + 1)):
            return None  # a worker left idle below one in use: the same plan moved up, skipped
        mode = Plan.of(exp.mfcs, choice).allocation_mode()
        if mode in scored:
            return scored[mode]
        scored[mode] = None
        try:
            planned = with_allocation(exp, mode)
        except ValueError as e:
            rejected[mode] = f"refused: {e}"
            return None
        try:
            peak = memory(planned) if memory is not None else None
        except ValueError as e:  # e.g. tensor parallelism the model's heads do not divide
            rejected[mode] = f"refused: {e}"
            return None
        if peak is not None and limit_bytes is not None and peak > limit_bytes:
            rejected[mode] = f"needs {peak / 2**30:.2f} GiB on a device of {limit_bytes / 2**30:.2f} GiB"
            return None
        scored[mode] = Candidate(mode, simulate(planned, costs, steps=steps), peak)
        return scored[mode]

    size = math.prod(len(o) for o in options)
    exhaustive = size <= exhaustive_limit
    if exhaustive:
        for choice in itertools.product(*options):
            score(choice)
    else:
        _metropolis(options, score, random.Random(seed), iterations, time_limit, start, temperature)
    ranked = sorted((c for c in scored.values() if c is not None), key=lambda c: c.simulation.step_seconds)
    if not ranked:
        reasons = "; ".join(f"{m}: {why}" for m, why in list(rejected.items())[:5])
        raise NoFeasiblePlan(
            f"no plan of {exp.experiment_name!r} on {n_workers} workers is feasible ({len(rejected)} "
            f"rejected; e.g. {reasons})"
        )
    return SearchResult(ranked, sorted(rejected.items()), len(scored), exhaustive, time.monotonic() - start)


def _metropolis(
    options: list[list[Placement]],
    score: Callable[[tuple[Placement, ...]], Candidate | None],
    rng: random.Random,
    iterations: int,
    time_limit: float | None,
    start: float,
    temperature: float,
) -> None:
    """Walk the space from the best one-layout plan (``score`` records every plan it sees)."""
    uniform = []
    for placement in options[0]:
        choice = tuple(placement if placement in o else o[0] for o in options)
        if (c := score(choice)) is not None:
            uniform.append((c.simulation.step_seconds, choice))
    if not uniform:
        return
    current_t, current = min(uniform, key=lambda tc: tc[0])
    for _ in range(iterations):
        if time_limit is not None and time.monotonic() - start > time_limit:
            return
        i = rng.randrange(len(options))
        proposal = list(current)
        proposal[i] = rng.choice(options[i])
        c = score(tuple(proposal))
        if c is None:
            continue
        t = c.simulation.step_seconds
        if t <= current_t or rng.random() < math.exp(-(t - current_t) / (temperature * current_t)):
            current_t, current = t, tuple(proposal)
