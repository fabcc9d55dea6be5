"""The short runs that measure what each call costs in each layout: the plan search's input.

For every layout the search may give a call, one short run of the experiment places every call
in that layout (``allocation_mode=<layout>``) and records each call's seconds (the median of its
``timing`` over the steps after the first two, which include warm-up), scaled so that the
simulator replays that run's own measured step: the workers' call times leave out the master's
round trips between calls, and a tensor-parallel rank's time counts its wait for its partner. One
more run on two workers puts a trained model's generate call on a worker of its own, and its
reallocations give the bandwidth a move of weights gets (bytes over seconds moving) and the bytes
one move of that model takes; the other models' bytes follow from their parameter counts. A last
run, of a plan whose calls overlap on disjoint workers, gives the contention between workers
computing side by side (``calibrate_contention``); and the search's best predicted plans run
briefly before one is chosen (``measure_plans``).

Runs go under ``<fileroot>/<experiment>-profile/``; what they measure goes into the cached table
of ``cost_table.py`` (one point per batch shape; a shape within reach of two measured ones is
interpolated and runs nothing).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable

from realrl.api.core.dfg import ModelInterfaceType
from realrl.api.core.layout import Layout
from realrl.api.core.model_size import model_configs, param_counts
from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.apps.plan_search.cost_table import Profile, Shape, cache_path, load, profile_key, task_fallback
from realrl.apps.plan_search.simulator import Costs, simulate
from realrl.apps.plan_search.space import with_allocation

PROFILE_STEPS = 8  # a short run: the medians of steps 3 .. 7 (the last one saves the model)
WARMUP_STEPS = 2


# runs one short experiment and returns its step records; None: it did not run (the search's
# time limit left no room for it: ``budget.py``), and nothing is measured
Runner = Callable[[CommonExperimentConfig], "list[dict] | None"]


def profile(
    name: str,
    cfg: CommonExperimentConfig,
    exp: ExperimentConfig,
    layouts: list[Layout],
    n_workers: int,
    run: Runner,
    interpolate: bool = True,
    fresh: bool = False,
) -> tuple[Profile, str, list[str]]:
    """The cached table for ``cfg``, completed by a run at ``cfg``'s shape for each layout it
    neither measured there nor can interpolate (``interpolate``: from two other shapes within
    reach), and the bandwidth run on 2+ workers when it has none; ``fresh``: an empty table
    instead of the cached one, which it replaces. ``run(config)``: runs one short experiment and
    returns its step records (None: not run; that layout stays uncosted). Returns the table, its
    file and the runs it took."""
    key = profile_key(name, exp, cfg)
    path = cache_path(cfg.fileroot, key)
    table = Profile() if fresh else load(path)
    shape = Shape.of(exp)
    ran = []
    for text in missing_layouts(table, shape, layouts, interpolate):
        placed = with_allocation(exp, text)  # a call that sees the whole batch stays on one worker
        records = run(_short(cfg, text, f"profile-{text}"))
        if records is None:
            continue
        graph = {m.name for m in exp.mfcs}  # "eval" and the like are no calls of the graph
        here = table.point(shape)
        for mfc, seconds in call_seconds(records).items():
            if mfc in graph:
                here.calls.setdefault((mfc, str(placed.call_placement(mfc).layout)), seconds)
        unscaled = Costs({k: s for k, s in here.calls.items()})
        here.scale[text] = step_gap(records) / simulate(placed, unscaled).step_seconds
        ran.append(text)
    table.points = [p for p in table.points if p.scale or p.measured]
    mode = move_mode(exp, table, n_workers)
    if mode is not None:
        mover = _moved_call(exp)
        records = run(_short(cfg, mode, "profile-move"))
        if records is not None:
            table.bandwidth, moved = move_rate(records, mover.role)
            table.model_bytes = _model_bytes(exp, cfg, mover.role, moved)
            ran.append(mode)
    if ran:
        table.save(path, key)
    return table, path, ran


def missing_layouts(table: Profile, shape: Shape, layouts: list[Layout], interpolate: bool) -> list[str]:
    """The layouts ``table`` neither measured at ``shape`` nor can interpolate there: to profile."""
    return [
        str(lay)
        for lay in layouts
        if str(lay) not in table.point(shape).scale and not (interpolate and table.covers(shape, str(lay)))
    ]


def move_mode(exp: ExperimentConfig, table: Profile, n_workers: int) -> str | None:
    """The plan whose run measures a move of weights, when ``table`` has no bandwidth yet."""
    mover = _moved_call(exp)
    if table.bandwidth is not None or n_workers < 2 or mover is None:
        return None
    return f"{mover.name}:d1m1p1@1,*:d1m1p1"


def calibrate_contention(
    cfg: CommonExperimentConfig, exp: ExperimentConfig, table: Profile, path: str, mode: str, run: Runner
) -> float | None:
    """Run ``mode`` (a plan whose calls overlap on disjoint workers) briefly and find the
    contention at which the simulator replays its measured step; stored in the table at ``path``
    (None: ``run`` did not run it)."""
    placed = with_allocation(exp, mode)
    costs = table.costs(Shape.of(exp))
    if simulate(placed, costs).overlap == 0.0:
        raise ValueError(f"nothing overlaps in {mode}: it cannot measure the contention between workers")
    records = run(_short(cfg, mode, "profile-contention"))
    if records is None:
        return None
    measured = step_gap(records)

    def predicted(c: float) -> float:
        return simulate(placed, dataclasses.replace(costs, contention=c)).step_seconds

    low, high = 1.0, MAX_CONTENTION
    if predicted(low) >= measured:
        high = low
    elif predicted(high) <= measured:
        low = high
    for _ in range(40):  # the step grows with the contention: bisect
        mid = (low + high) / 2
        low, high = (mid, high) if predicted(mid) < measured else (low, mid)
    table.contention, table.contention_plan = (low + high) / 2, mode
    with open(path) as f:
        key = json.load(f)["key"]
    table.save(path, key)
    return table.contention


MAX_CONTENTION = 4.0


def measure_plans(
    cfg: CommonExperimentConfig,
    exp: ExperimentConfig,
    table: Profile,
    path: str,
    modes: list[str],
    run: Runner,
) -> tuple[dict[str, float], list[str]]:
    """Each of ``modes``' step seconds in a short run at ``cfg``'s shape (cached in the table):
    the search's best predictions checked before one is chosen. Returns them (those ``run`` did
    not run left out) and the modes run."""
    here = table.point(Shape.of(exp))
    ran = []
    for mode in modes:
        if mode not in here.measured:
            records = run(_short(cfg, mode, f"verify-{mode}"))
            if records is None:
                continue
            here.measured[mode] = step_gap(records)
            ran.append(mode)
    if ran:
        with open(path) as f:
            table.save(path, json.load(f)["key"])
    return {m: here.measured[m] for m in modes if m in here.measured}, ran


STALE = 0.15  # plans run briefly all this far off their predictions, one way: the costs look stale


def drift(predicted: dict[str, float], measured: dict[str, float]) -> float | None:
    """How far the plans run briefly measured from their predictions (the median of measured /
    predicted - 1) when every one of them missed by more than ``STALE`` the same way, else None:
    a whole profile off by one factor is what a machine whose speed changed since it was
    measured gives (the ranking may still hold; the predicted seconds do not)."""
    ratios = sorted(measured[m] / predicted[m] - 1 for m in measured if predicted.get(m))
    if not ratios or not (all(r > STALE for r in ratios) or all(r < -STALE for r in ratios)):
        return None
    return statistics.median(ratios)


def _short(cfg: CommonExperimentConfig, allocation_mode: str, trial: str) -> CommonExperimentConfig:
    """``cfg`` as a short profiling run in ``allocation_mode``, under its own run folder."""
    ctrl = dataclasses.replace(
        cfg.exp_ctrl, total_train_steps=PROFILE_STEPS, save_freq_steps=None, ckpt_freq_steps=None
    )
    name = f"{cfg.experiment_name}-profile"
    trial = "".join(c if c.isalnum() or c in "-_" else "-" for c in trial)
    return dataclasses.replace(
        cfg, allocation_mode=allocation_mode, exp_ctrl=ctrl, experiment_name=name, trial_name=trial
    )


def describe(cfg: CommonExperimentConfig) -> str:
    """What a short run made by ``_short`` is for, in words: its progress lines name it so."""
    kind, _, rest = cfg.trial_name.partition("-")
    mode = cfg.allocation_mode
    if kind == "verify":
        return f"verification run of {mode}"
    if rest == "move":
        return f"move profile ({mode}: a move of weights)"
    if rest == "contention":
        return f"contention profile ({mode}: calls side by side)"
    return f"profile of layout {mode}"


def call_seconds(records: list[dict]) -> dict[str, float]:
    """Each call's median seconds over the steps after warm-up (a reallocation's are left out)."""
    steady = records[WARMUP_STEPS:] or records
    names = {k for r in steady for k in r.get("timing", {}) if not k.startswith("realloc")}
    return {k: statistics.median(r["timing"][k] for r in steady if k in r["timing"]) for k in sorted(names)}


def step_gap(records: list[dict]) -> float:
    """The median time between steps after warm-up (the last step, which saves the model, left out)."""
    times = [r["time"] for r in records]
    gaps = [b - a for a, b in zip(times[WARMUP_STEPS:-1], times[WARMUP_STEPS + 1 : -1])]
    return statistics.median(gaps or [b - a for a, b in zip(times, times[1:])] or [0.0])


def move_rate(records: list[dict], role: str) -> tuple[float, float]:
    """(bytes per second moving, bytes per move) of ``role``'s reallocations in ``records``."""
    moves = [
        (
            r[f"realloc/{role}/bytes"] / r[f"realloc/{role}/count"],
            r[f"realloc/{role}/seconds"] / r[f"realloc/{role}/count"],
        )
        for r in records
        if r.get(f"realloc/{role}/count")
    ]
    if not moves:
        raise ValueError(f"the profiling run moved no weights of {role!r}: no bandwidth to measure")
    size = statistics.median(b for b, _ in moves)
    seconds = statistics.median(s for _, s in moves)
    return size / max(seconds, 1e-6), size


def _moved_call(exp: ExperimentConfig):
    """A call of a trained model other than its training (its generation, usually): where a
    move of weights is measured."""
    trained = set(exp.trained_roles())
    return next(
        (m for m in exp.mfcs if m.role in trained and m.interface_type is not ModelInterfaceType.TRAIN_STEP),
        None,
    )


def _model_bytes(
    exp: ExperimentConfig, cfg: CommonExperimentConfig, measured_role: str, moved: float
) -> dict:
    """Bytes of one move of each model: measured for one, the others by their parameter counts."""
    configs = model_configs(exp, task_fallback(cfg))
    per_param = moved / param_counts(configs[measured_role], 1)[0]
    return {role: param_counts(c, 1)[0] * per_param for role, c in configs.items() if c is not None}
