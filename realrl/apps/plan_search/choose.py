"""The plan to run: the calls costed (profiled where the cache lacks them, or on paper), the plans
searched, and the best predicted ones run briefly before one is chosen. What ``python -m
realrl.apps.search`` prints and ``allocation_mode=search`` runs.

``search_plan`` returns a ``PlanSearch``: the plans best first, the costs they were scored with,
the profiling runs it took, and the step seconds of the plans run briefly (``to_verify``: the best
distinct predictions and the best of each kind, calls overlapping on disjoint workers or not);
its ``best`` is the fastest of those measured. Before anything runs it prints the plan of work
(``work_plan.py``), a line as each run starts and ends, and it keeps to ``search.time_limit_s``
(``budget.py``: runs that do not fit are skipped, and the result says which).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

from realrl.api.core.devices import is_cuda, visible_gpu_count
from realrl.api.core.layout import Layout
from realrl.api.core.model_size import model_configs
from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.api.quickstart.memory_plan import plan_memory
from realrl.apps.errors import UserError
from realrl.apps.feasibility import check_feasible
from realrl.apps.plan_search.budget import Budget
from realrl.apps.plan_search.cost_table import Profile, Shape, cache_path, load, profile_key, task_fallback
from realrl.apps.plan_search.paper_costs import HARDWARE, paper_costs
from realrl.apps.plan_search.profiles import (
    PROFILE_STEPS,
    Runner,
    calibrate_contention,
    drift,
    measure_plans,
    missing_layouts,
    move_mode,
    profile,
)
from realrl.apps.plan_search.search import EXHAUSTIVE_LIMIT, Candidate, SearchResult, search
from realrl.apps.plan_search.simulator import Costs
from realrl.apps.plan_search.space import call_options, with_allocation
from realrl.apps.plan_search.work_plan import Work
from realrl.base import logging

logger = logging.getLogger("search")

GiB = 1024**3


def n_workers(cfg: CommonExperimentConfig) -> int:
    """The devices the plan is for: nodes times devices per node (default: this machine's GPUs,
    or its cores on a CPU machine)."""
    per_node = cfg.search.n_gpus_per_node or visible_gpu_count() or os.cpu_count() or 1
    return cfg.search.n_nodes * per_node


@dataclasses.dataclass
class PlanSearch:
    result: SearchResult  # the plans, best first
    experiment: ExperimentConfig  # the experiment searched (in layout d1)
    costs: Costs  # what its calls and moves cost
    profiled: list[str] = dataclasses.field(default_factory=list)  # the profiling runs it took
    contention_plan: str | None = None  # the plan whose run measured the contention
    measured: dict[str, float] = dataclasses.field(default_factory=dict)  # plans run briefly: s/step
    skipped: str | None = None  # the time limit reached: one line saying what was not run

    @property
    def best(self) -> Candidate:
        """The plan to run: the fastest measured of those run briefly, else the best predicted."""
        if self.measured:
            fastest = min(self.measured, key=self.measured.__getitem__)
            return next(c for c in self.result.ranked if c.allocation_mode == fastest)
        return self.result.ranked[0]


def search_plan(
    name: str, cfg: CommonExperimentConfig, budget: Budget | None = None, run: Runner | None = None
) -> PlanSearch:
    """Cost the calls (profiling what the cache lacks, or on paper), then search: ``cfg``'s plans
    best first. The phases it builds on (SFT, a reward model) run first when their checkpoints
    are missing: the profiling runs read them. ``budget``: the time limit and where progress
    lines go (default: ``search.time_limit_s``, the log); ``run``: launches a short run
    (default: ``realrl.apps.run.run_one``)."""
    from realrl.apps.run import plan_phases, run_one

    options = cfg.search
    budget = budget or Budget(options.time_limit_s)
    workers, per_node = n_workers(cfg), options.n_gpus_per_node
    provisional = dataclasses.replace(cfg, allocation_mode="d1")
    paper = options.costs == "paper"
    if paper:  # nothing runs: the model folders need only their config.json, the data no file
        exp, before = provisional.initial_setup(), []
    else:
        *before, phase = plan_phases(name, provisional)
        exp = phase.experiment
    configs = model_configs(exp, task_fallback(cfg))
    limit = options.device_memory_gb
    if limit is None and (paper or is_cuda(exp.device)):
        limit = 80.0

    def ranked(costs: Costs, costed_only: bool = False, runs_after: int = 0) -> SearchResult:
        """The plans searched; under a limit, in the time left less what those of the
        ``runs_after`` short runs still to come that can fit in it take (at least a quarter of it)."""
        left = budget.left()
        if left is not None:
            each = budget.run_estimate()
            fit = min(runs_after, int(max(left, 0.0) // each))
            left = max(left - fit * each, left / 4, 0.0)
        budget.out("searching the plans" + ("" if left is None else f" (for {left:.0f} s at most)"))
        result = search(
            exp,
            costs,
            workers,
            memory=lambda planned: max(w.peak for w in plan_memory(planned, configs).workers),
            limit_bytes=None if limit is None else int(limit * GiB),
            seed=options.seed,
            iterations=options.iterations,
            time_limit=left,
            per_node=per_node,
            compare=options.compare,
            costed_only=costed_only,
        )
        cut = ", stopped at the time limit" if result.stopped else ""
        budget.out(f"searched {result.evaluated} plans in {result.seconds:.1f} s{cut}")
        return result

    if paper:
        if options.hardware not in HARDWARE:
            raise UserError(f"search.hardware={options.hardware!r} is not one of {sorted(HARDWARE)}")
        costs = paper_costs(exp, configs, workers, HARDWARE[options.hardware])
        budget.begin()
        return PlanSearch(ranked(costs), exp, costs)
    layouts = _layouts(exp, workers, per_node, task_fallback(cfg))
    _announce(name, provisional, exp, [(p.name, p.config) for p in before], layouts, workers, budget)
    for pre in before:
        budget.out(f"start the prerequisite {pre.name} phase (its checkpoint is missing)")
        seconds = budget.clock()
        run_one(pre.config, exp=pre.experiment)
        budget.out(f"done the {pre.name} phase in {budget.clock() - seconds:.1f} s")
    budget.begin()  # the limit counts from here: the prerequisites' checkpoints serve the run itself
    gated = budget.runner(run or run_one)
    found = _profiled_search(name, provisional, exp, layouts, workers, ranked, gated, budget)
    found.skipped = budget.skipped_line()
    return found


def _layouts(
    exp: ExperimentConfig, workers: int, per_node: int | None, fallback: dict | None
) -> list[Layout]:
    """The layouts the space gives some call and the pre-run check accepts: those profiled."""
    options = sorted({p.layout for m in exp.mfcs for p in call_options(m, workers, per_node)}, key=str)
    return [lay for lay in options if _runnable(exp, lay, fallback)]


def _announce(
    name: str,
    cfg: CommonExperimentConfig,
    exp: ExperimentConfig,
    phases: list[tuple[str, CommonExperimentConfig]],
    layouts: list[Layout],
    workers: int,
    budget: Budget,
) -> None:
    """Print the plan of work (``work_plan.Work``) from the cached table, before anything runs."""
    table = Profile() if cfg.search.reprofile else load(cache_path(cfg.fileroot, profile_key(name, exp, cfg)))
    budget.recorded_s = table.run_seconds
    shape = Shape.of(exp)
    todo = missing_layouts(table, shape, layouts, cfg.search.interpolate)
    sizes = [len(call_options(m, workers, cfg.search.n_gpus_per_node)) for m in exp.mfcs]
    plans = math.prod(sizes)
    exhaustive = plans <= EXHAUSTIVE_LIMIT
    work = Work(
        phases=phases,
        profiles=todo,
        cached_profiles=len(layouts) - len(todo),
        move=move_mode(exp, table, workers),
        contention=cfg.search.contention and table.contention is None and workers >= 2 and len(exp.mfcs) > 1,
        plans=plans if exhaustive else cfg.search.iterations,
        exhaustive=exhaustive,
        verify=(cfg.search.verify + 1) if workers >= 2 and cfg.search.verify else 0,
        run_s=budget.run_estimate(),
        timed=table.run_seconds is not None,
        limit_s=budget.limit_s,
    )
    for line in work.lines():
        budget.out(line)


def _profiled_search(
    name: str,
    cfg: CommonExperimentConfig,
    exp: ExperimentConfig,
    layouts: list[Layout],
    workers: int,
    ranked: Callable[..., SearchResult],
    run: Runner,
    budget: Budget,
) -> PlanSearch:
    """Profile what the cache lacks, search; then, once per cache, run the best plan whose calls
    overlap on disjoint workers to measure the contention between them, and search again; then
    run the best predicted briefly. ``run`` (gated by ``budget``) returns None for a run the
    time limit skips: the search goes on with what is measured."""
    table, path, ran = profile(
        name,
        cfg,
        exp,
        layouts,
        workers,
        run=run,
        interpolate=cfg.search.interpolate,
        fresh=cfg.search.reprofile,
    )
    logger.info("call costs from %s%s", path, f" (profiled now: {', '.join(ran)})" if ran else " (cached)")
    shape = Shape.of(exp)
    if not table.costs(shape).calls:
        raise UserError(
            f"search.time_limit_s={budget.limit_s:g} ran out before any layout was profiled "
            f"(a profiling run takes ~{budget.run_estimate():.0f} s of {PROFILE_STEPS} steps here): "
            "no plan to report; raise it, or set it to null for none"
        )
    verify = cfg.search.verify if workers >= 2 else 0
    contention = cfg.search.contention and table.contention is None and workers >= 2
    result = ranked(table.costs(shape), budget.reached, contention + verify)
    if contention:
        overlapping = next((c for c in result.ranked if c.simulation.overlap > OVERLAP_TO_MEASURE), None)
        if overlapping is not None:
            c = calibrate_contention(cfg, exp, table, path, overlapping.allocation_mode, run)
            if c is not None:
                logger.info("contention %.2f, measured by running %s", c, overlapping.allocation_mode)
                ran.append(overlapping.allocation_mode)
                result = ranked(table.costs(shape), budget.reached, verify)
    measured: dict[str, float] = {}
    if verify:
        best = to_verify(result.ranked, verify)
        measured, runs = measure_plans(cfg, exp, table, path, best, run)
        ran += runs
        logger.info("the best predicted plans run briefly: %s", {m: round(s, 4) for m, s in measured.items()})
        off = drift({c.allocation_mode: c.simulation.step_seconds for c in result.ranked}, measured)
        if off is not None:
            logger.warning(
                "the plans run briefly all measured %+.0f %% against their predictions: the costs in %s "
                "look stale (the machine's speed may have changed since they were measured); "
                "search.reprofile=true measures them again",
                100 * off,
                path,
            )
    if budget.run_seconds and os.path.isfile(path):  # the next plan of work estimates from them
        table.run_seconds = budget.run_estimate()
        table.save(path, profile_key(name, exp, cfg))
    return PlanSearch(result, exp, table.costs(shape), ran, table.contention_plan, measured)


def _runnable(exp: ExperimentConfig, layout: Layout, fallback: dict | None) -> bool:
    """Whether the pre-run check (``check_feasible``) accepts ``exp`` run in ``layout``: only
    those layouts are profiled."""
    try:
        check_feasible(with_allocation(exp, str(layout)), fallback=fallback)
    except ValueError as e:
        logger.info("layout %s is not profiled: %s", layout, e)
        return False
    return True


OVERLAP_TO_MEASURE = 0.05  # the least overlap of a plan the contention is measured on


def distinct(ranked: list[Candidate]) -> list[list[Candidate]]:
    """The plans grouped by their figures, best first: plans of one group differ only where it
    makes no difference (which worker computes the advantages, say)."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in ranked:
        groups.setdefault(_figures(c), []).append(c)
    return list(groups.values())


SIMULATOR_ERROR = 0.15  # how far a prediction may be off (benchmarks/bench_search.py measures it)


def to_verify(ranked: list[Candidate], n: int) -> list[str]:
    """The plans to run briefly before one is chosen: the ``n`` best distinct predictions, and the
    best of each kind, plans whose calls overlap on disjoint workers and plans whose calls do not,
    predicted within ``SIMULATOR_ERROR`` of the best. What separates the two kinds is the
    contention, one factor fitted to one short run: when it comes out high, every overlapping plan
    drops below a run of sequential ones that differ in one call's worker, and the top ``n`` alone
    would never run a plan of the kind that is in fact faster (seen on 2 CPU workers: side-by-side
    trainings predicted 4.6 % behind, measured 23 % ahead)."""
    groups = [g[0] for g in distinct(ranked)]
    if not groups:
        return []
    chosen = [c.allocation_mode for c in groups[:n]]
    within = groups[0].simulation.step_seconds * (1 + SIMULATOR_ERROR)
    for overlapping in (True, False):
        kind = (c for c in groups if (c.simulation.overlap > OVERLAP_TO_MEASURE) == overlapping)
        first = next(kind, None)
        if (
            first is not None
            and first.simulation.step_seconds <= within
            and first.allocation_mode not in chosen
        ):
            chosen.append(first.allocation_mode)
    return chosen


def _figures(c: Candidate) -> tuple:
    sim = c.simulation
    return (sim.step_seconds, sim.realloc_seconds, c.peak_bytes, tuple(sorted(sim.call_seconds.items())))
