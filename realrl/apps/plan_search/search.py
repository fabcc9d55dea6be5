"""Search the execution plans of an experiment: every call's placement, scored by the simulator.

Where the space is small (at most ``exhaustive_limit`` plans) and, under a ``time_limit``,
simulating every plan fits in it at the pace the one-layout plans were scored, every plan is
simulated (should the limit pass all the same: the best of those scored by then, once one is).
Otherwise a Metropolis search ("ReaL: Efficient RLHF Training of Large Language Models with Parameter
Reallocation" searches its plans by MCMC too) starts from the best plan that uses one layout for
every call, changes one call's placement at a time, keeps a better plan always and a worse one
with probability exp(-(t_new - t_old) / (temperature * t_old)), and stops after ``iterations``
proposals (or ``time_limit`` seconds, whichever comes first); plans given to compare are starting
points too, so the search never returns worse than a hand-made plan in its space. Plans over the device memory are
states of the walk too, above every plan that fits and ordered by their excess: where no
one-layout plan fits (a 70B model), the walk descends from the least excessive one to plans
that do. With a seed and no time limit
reached, the result is the same on every machine. Plans the runtime refuses, or whose memory
plan exceeds the device, are reported as rejected with the reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence

from realrl.api.core.dfg import MFCDef
from realrl.api.core.layout import Placement
from realrl.api.core.system_api import ExperimentConfig
from realrl.apps.plan_search.simulator import Costs, MissingCost, Simulation, simulate
from realrl.apps.plan_search.space import Plan, call_options, with_allocation


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
    # plans asked for by name (e.g. hand-made ones), scored with the same costs: a candidate, or
    # why it was rejected
    compared: dict[str, Candidate | str] = dataclasses.field(default_factory=dict)
    stopped: bool = False  # the time limit ended it (the best of the plans scored by then)


EXHAUSTIVE_LIMIT = 20_000  # a space of at most this many plans is searched by simulating every one


class NoFeasiblePlan(ValueError):
    """Every plan of the space was refused or does not fit."""


def search(
    exp: ExperimentConfig,
    costs: Costs,
    n_workers: int,
    memory: Callable[[ExperimentConfig], int] | None = None,
    limit_bytes: int | None = None,
    seed: int = 1,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
    iterations: int = 3_000,
    time_limit: float | None = None,
    temperature: float = 0.05,
    steps: int = 16,
    per_node: int | None = None,
    compare: Sequence[str] = (),
    costed_only: bool = False,
) -> SearchResult:
    """The plans of ``exp`` on ``n_workers`` workers (``per_node`` in each node), best (shortest
    simulated step) first. ``memory(plan's config)``: its largest worker's peak bytes, checked
    against ``limit_bytes``. ``compare``: ``allocation_mode`` strings scored beside the search.
    ``costed_only``: each call only in the layouts ``costs`` has (profiles the time limit left
    out are then no plans, rather than plans rejected for want of a cost)."""
    start = time.monotonic()
    options = [_admissible(exp, m, call_options(m, n_workers, per_node), memory) for m in exp.mfcs]
    if costed_only:
        options = [
            [p for p in o if (m.name, str(p.layout)) in costs.calls] or o
            for m, o in zip(exp.mfcs, options, strict=True)
        ]
    scored: dict[str, Candidate | None] = {}
    rejected: dict[str, str] = {}

    over: dict[str, float] = {}  # plans over the device memory: by how much (a fraction of it)

    def score(choice: tuple[Placement, ...]) -> Candidate | None:
        used = {w for p in choice for w in p.workers}
        if used != set(range(max(used) + 1)):
            return None  # a worker left idle below one in use: the same plan moved up, skipped
        return evaluate(Plan.of(exp.mfcs, choice).allocation_mode())

    def energy(choice: tuple[Placement, ...]) -> float | None:
        """What the Metropolis walk minimises: a feasible plan's step; a plan over the memory
        ranks above every feasible one, lower the less it exceeds (so the walk finds its way to
        plans that fit from a start that does not); a refused plan is no state at all."""
        found = score(choice)
        if found is not None:
            return found.simulation.step_seconds
        mode = Plan.of(exp.mfcs, choice).allocation_mode()
        return OVER_MEMORY * (1 + over[mode]) if mode in over else None

    def evaluate(mode: str) -> Candidate | None:
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
            over[mode] = peak / limit_bytes - 1
            return None
        try:
            simulation = simulate(planned, costs, steps=steps)
        except MissingCost as e:  # a plan asked for by name in a layout nobody costed
            rejected[mode] = f"no cost: {e.args[0]}"
            return None
        scored[mode] = Candidate(mode, simulation, peak)
        return scored[mode]

    size = math.prod(len(o) for o in options)
    exhaustive, stopped = size <= exhaustive_limit, False
    if exhaustive and time_limit is not None:  # cut short, the product's order would favour its first calls
        exhaustive = _affordable(size, _one_layout(options), energy, start, time_limit)
    if exhaustive:
        found = False
        for choice in itertools.product(*options):
            if found and time_limit is not None and time.monotonic() - start > time_limit:
                exhaustive, stopped = False, True  # the best of the plans scored by the limit
                break
            found = score(choice) is not None or found
    else:
        starts = [c for mode in compare if (c := _choice(exp, mode, options)) is not None]
        stopped = _metropolis(
            options, energy, random.Random(seed), iterations, time_limit, start, temperature, starts
        )
    ranked = sorted((c for c in scored.values() if c is not None), key=lambda c: c.simulation.step_seconds)
    evaluated, refusals = len(scored), sorted(rejected.items())
    compared: dict[str, Candidate | str] = {}
    for mode in compare:
        scored.pop(mode, None)  # scored again, so that a rejection says why
        found = evaluate(mode)
        compared[mode] = found if found is not None else rejected.get(mode, "refused")
    if not ranked:
        reasons = "; ".join(f"{m}: {why}" for m, why in list(rejected.items())[:5])
        raise NoFeasiblePlan(
            f"no plan of {exp.experiment_name!r} on {n_workers} workers is feasible ({len(rejected)} "
            f"rejected; e.g. {reasons})"
        )
    seconds = time.monotonic() - start
    return SearchResult(ranked, refusals, evaluated, exhaustive, seconds, compared, stopped)


def _admissible(
    exp: ExperimentConfig,
    mfc: MFCDef,
    placements: list[Placement],
    memory: Callable[[ExperimentConfig], int] | None,
) -> list[Placement]:
    """The placements of ``mfc`` its model can take (tensor parallelism its heads divide, ...):
    each tried alone, the other calls on one worker, so that the search spends no proposal on a
    layout the runtime refuses whatever the rest of the plan."""
    kept = []
    for p in placements:
        mode = f"{mfc.name}:{p.layout}@{p.workers[0]},*:d1m1p1"
        try:
            planned = with_allocation(exp, mode)
            if memory is not None:
                memory(planned)
        except ValueError:
            continue
        kept.append(p)
    return kept or placements  # none admissible: let the search report why


def _choice(exp: ExperimentConfig, mode: str, options: list[list[Placement]]) -> tuple[Placement, ...] | None:
    """``mode`` as a point of the space (None: the runtime refuses it, or it lies outside)."""
    try:
        planned = with_allocation(exp, mode)
    except ValueError:
        return None
    choice = tuple(planned.call_placement(m.name) for m in exp.mfcs)
    return choice if all(p in o for p, o in zip(choice, options, strict=True)) else None


OVER_MEMORY = 1e6  # the energy of a plan over the device memory, times one plus its excess


def _one_layout(options: list[list[Placement]]) -> list[tuple[Placement, ...]]:
    """The plans that give every call the placement of the first call (where it may take it)."""
    return [tuple(p if p in o else o[0] for o in options) for p in options[0]]


def _affordable(
    size: int,
    samples: list[tuple[Placement, ...]],
    energy: Callable[[tuple[Placement, ...]], float | None],
    start: float,
    time_limit: float,
) -> bool:
    """Whether ``size`` plans can be scored within ``time_limit`` of ``start``, at the pace of
    scoring ``samples`` (scored now; the scoring keeps them for the search that follows)."""
    began = time.monotonic()
    for choice in samples:
        energy(choice)
    per_plan = (time.monotonic() - began) / max(len(samples), 1)
    return time.monotonic() - start + size * per_plan <= time_limit


def _metropolis(
    options: list[list[Placement]],
    energy: Callable[[tuple[Placement, ...]], float | None],
    rng: random.Random,
    iterations: int,
    time_limit: float | None,
    start: float,
    temperature: float,
    starts: Sequence[tuple[Placement, ...]] = (),
) -> bool:
    """Walk the space from the plan of least energy among the one-layout plans and ``starts``
    (the scoring records every plan it sees): proposals change one call's placement; a lower
    energy is always taken, a higher one with probability exp(-(e_new - e_old) / (temperature *
    e_old)). Returns whether the time limit stopped it."""
    begun = [(e, choice) for choice in [*_one_layout(options), *starts] if (e := energy(choice)) is not None]
    if not begun:
        return False
    current_e, current = min(begun, key=lambda ec: ec[0])
    for _ in range(iterations):
        if time_limit is not None and time.monotonic() - start > time_limit:
            return True
        i = rng.randrange(len(options))
        proposal = list(current)
        proposal[i] = rng.choice(options[i])
        e = energy(tuple(proposal))
        if e is None:
            continue
        if e <= current_e or rng.random() < math.exp(-(e - current_e) / (temperature * current_e)):
            current_e, current = e, tuple(proposal)
    return False
