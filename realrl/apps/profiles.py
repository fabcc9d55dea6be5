"""What each call costs in each layout, measured by short runs and cached: the plan search's input.

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

Runs go under ``<fileroot>/<experiment>-profile/``; the table is cached in
``<fileroot>/plan_profiles/`` under a key of the experiment, its models, its interfaces and the
hardware, with one point per batch shape measured (each call's sequences per step, the prompt
and answer lengths: a ``Shape``). A search at a shape measured before runs nothing; at a new shape
it interpolates each call's seconds linearly in the tokens the call processes from two measured
shapes within reach (``REACH``), and measures only what it cannot interpolate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import statistics
from collections.abc import Callable
from typing import Any

from realrl.api.core.dfg import ModelInterfaceType
from realrl.api.core.layout import Layout
from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.api.quickstart.memory_plan import batch_shape, model_configs, param_counts
from realrl.api.quickstart.plan_space import with_allocation
from realrl.base import logging
from realrl.impl.model.backend.integrity import write_json_atomic
from realrl.system.simulator import Costs, simulate

logger = logging.getLogger("profiles")

PROFILE_STEPS = 8  # a short run: the medians of steps 3 .. 7 (the last one saves the model)
WARMUP_STEPS = 2


def hardware() -> dict[str, Any]:
    """What the seconds depend on besides the experiment (no torch import: read from metadata)."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch_version}


def profile_key(name: str, exp: ExperimentConfig, cfg: CommonExperimentConfig) -> dict[str, Any]:
    """The experiment, its models' architectures, its calls' interfaces, the device and the
    hardware: what the measured seconds depend on besides the batch shape (a ``Shape``: the
    table holds one point per shape measured)."""
    fallback = _fallback(cfg)
    models = {
        role: None if c is None else dataclasses.asdict(c) for role, c in model_configs(exp, fallback).items()
    }
    calls = {
        m.name: {"interface": _without_shape(m.interface_impl), "type": m.interface_type.value}
        for m in exp.mfcs
    }
    return {
        "experiment": name,
        "models": models,
        "calls": calls,
        "device": str(cfg.device),
        "threads": cfg.torch_threads,
        "hardware": hardware(),
    }


SHAPE_KEYS = frozenset({"max_new_tokens", "min_new_tokens"})  # interface arguments a Shape holds


def _without_shape(impl: Any) -> str:
    """An interface's name and arguments without the lengths a ``Shape`` holds: one profile serves
    every batch size and answer length of an experiment."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in SHAPE_KEYS}
        return value

    return repr((impl.type_, strip(impl.args))) if hasattr(impl, "args") else repr(impl)


def _fallback(cfg: CommonExperimentConfig) -> dict | None:
    if not cfg.task:
        return None
    from realrl.experiments.tasks import get_task

    return get_task(cfg.task).model_config()


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a call's seconds grow with: each call's sequences per step, the prompt length and the
    answer length the experiment allows (its configured bounds: answers may end earlier)."""

    n_seqs: tuple[tuple[str, int], ...]
    prompt_len: int
    new_tokens: int

    @classmethod
    def of(cls, exp: ExperimentConfig) -> Shape:
        geometry = batch_shape(exp)
        calls = tuple(sorted((m.name, m.n_seqs) for m in exp.mfcs))
        return cls(calls, geometry["prompt_len"], geometry["new_tokens"])

    def tokens(self, mfc: str) -> int:
        """The tokens ``mfc`` processes per step, at most: what its seconds are interpolated over."""
        return dict(self.n_seqs)[mfc] * (self.prompt_len + self.new_tokens)

    def to_json(self) -> dict:
        return {"n_seqs": dict(self.n_seqs), "prompt_len": self.prompt_len, "new_tokens": self.new_tokens}

    @classmethod
    def from_json(cls, raw: dict) -> Shape:
        return cls(tuple(sorted(raw["n_seqs"].items())), raw["prompt_len"], raw["new_tokens"])


@dataclasses.dataclass
class Point:
    """The calls' seconds measured at one shape; per layout, the profiling run's measured step
    over the one the simulator makes of its calls' seconds (the calls' costs in that layout are
    scaled by it: it carries the master's round trips between calls)."""

    shape: Shape
    calls: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    scale: dict[str, float] = dataclasses.field(default_factory=dict)
    measured: dict[str, float] = dataclasses.field(default_factory=dict)  # plan -> s/step run briefly

    def scaled(self) -> dict[tuple[str, str], float]:
        return {
            (m, layout): s * self.scale[layout]
            for (m, layout), s in self.calls.items()
            if layout in self.scale
        }

    def to_json(self) -> dict:
        calls = {f"{m}|{layout}": s for (m, layout), s in sorted(self.calls.items())}
        return {"shape": self.shape.to_json(), "calls": calls, "scale": self.scale, "measured": self.measured}

    @classmethod
    def from_json(cls, raw: dict) -> Point:
        calls = {tuple(k.split("|", 1)): float(v) for k, v in raw["calls"].items()}
        scale = {k: float(v) for k, v in raw["scale"].items()}
        return cls(Shape.from_json(raw["shape"]), calls, scale, dict(raw.get("measured", {})))


@dataclasses.dataclass
class Profile:
    """The measured shapes (``points``), the moves' bandwidth, each model's bytes per move, and
    the contention between workers computing side by side (None: not measured yet) with the plan
    whose run measured it."""

    points: list[Point] = dataclasses.field(default_factory=list)
    bandwidth: float | None = None
    model_bytes: dict[str, float] = dataclasses.field(default_factory=dict)
    contention: float | None = None
    contention_plan: str | None = None  # the plan whose run measured it

    def point(self, shape: Shape) -> Point:
        """The point measured at ``shape`` (a new, empty one added if none is)."""
        for p in self.points:
            if p.shape == shape:
                return p
        self.points.append(Point(shape))
        return self.points[-1]

    def covers(self, shape: Shape, layout: str) -> bool:
        """Whether ``layout``'s costs at ``shape`` are measured, or lie within reach of two other
        measured shapes (between them, or at most ``REACH`` times beyond)."""
        measured = [p for p in self.points if layout in p.scale]
        if any(p.shape == shape for p in measured):
            return True
        calls = [m for m, _ in shape.n_seqs]
        for m in calls:
            sizes = {p.shape.tokens(m) for p in measured if dict(p.shape.n_seqs).get(m)}
            if len(sizes) < 2 or not min(sizes) / REACH <= shape.tokens(m) <= max(sizes) * REACH:
                return False
        return True

    def costs(self, shape: Shape) -> Costs:
        """The calls' costs at ``shape``: measured there, or interpolated linearly in the tokens
        each call processes from the measured shapes nearest it."""
        exact = next((p for p in self.points if p.shape == shape), None)
        calls = dict(exact.scaled()) if exact is not None else {}
        samples: dict[tuple[str, str], dict[int, list[float]]] = {}
        for p in self.points:
            for (m, layout), s in p.scaled().items():
                if (m, layout) not in calls and dict(p.shape.n_seqs).get(m):
                    samples.setdefault((m, layout), {}).setdefault(p.shape.tokens(m), []).append(s)
        for (m, layout), by_size in samples.items():
            curve = sorted((w, statistics.mean(v)) for w, v in by_size.items())
            if len(curve) >= 2:
                calls[(m, layout)] = _interpolate(curve, shape.tokens(m))
        return Costs(calls, dict(self.model_bytes), self.bandwidth or 1e12, contention=self.contention or 1.0)

    def to_json(self, key: dict) -> dict:
        return {
            "key": key,
            "points": [p.to_json() for p in self.points],
            "bandwidth": self.bandwidth,
            "model_bytes": self.model_bytes,
            "contention": self.contention,
            "contention_plan": self.contention_plan,
        }

    @classmethod
    def from_json(cls, raw: dict) -> Profile:
        points = [Point.from_json(p) for p in raw.get("points", [])]
        model_bytes = {k: float(v) for k, v in raw.get("model_bytes", {}).items()}
        return cls(
            points, raw.get("bandwidth"), model_bytes, raw.get("contention"), raw.get("contention_plan")
        )

    def save(self, path: str, key: dict) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomic(path, self.to_json(key))


REACH = 2.0  # how far beyond the measured sizes a call's seconds are extrapolated


def _interpolate(curve: list[tuple[int, float]], size: int) -> float:
    """Piecewise linear through ``curve`` (sizes ascending); beyond it, the line through its two
    nearest points, kept above a tenth of the nearest measured seconds."""
    if size <= curve[0][0]:
        (w0, t0), (w1, t1) = curve[0], curve[1]
    elif size >= curve[-1][0]:
        (w0, t0), (w1, t1) = curve[-2], curve[-1]
    else:
        i = next(i for i, (w, _) in enumerate(curve) if w >= size)
        (w0, t0), (w1, t1) = curve[i - 1], curve[i]
    value = t0 + (t1 - t0) * (size - w0) / (w1 - w0)
    nearest = min(curve, key=lambda wt: abs(wt[0] - size))[1]
    return max(value, nearest / 10)


def cache_path(fileroot: str, key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return os.path.join(fileroot, "plan_profiles", f"{key['experiment']}-{digest}.json")


def load(path: str) -> Profile:
    if not os.path.isfile(path):
        return Profile()
    with open(path) as f:
        return Profile.from_json(json.load(f))


Runner = Callable[[CommonExperimentConfig], list[dict]]


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
    returns its step records. Returns the table, its file and the runs it took."""
    key = profile_key(name, exp, cfg)
    path = cache_path(cfg.fileroot, key)
    table = Profile() if fresh else load(path)
    shape = Shape.of(exp)
    ran = []
    for layout in layouts:
        text = str(layout)
        measured = text in table.point(shape).scale
        if measured or (interpolate and table.covers(shape, text)):
            continue
        logger.info("profiling every call of %s in layout %s (%d steps)", name, text, PROFILE_STEPS)
        placed = with_allocation(exp, text)  # a call that sees the whole batch stays on one worker
        records = run(_short(cfg, text, f"profile-{text}"))
        graph = {m.name for m in exp.mfcs}  # "eval" and the like are no calls of the graph
        here = table.point(shape)
        for mfc, seconds in call_seconds(records).items():
            if mfc in graph:
                here.calls.setdefault((mfc, str(placed.call_placement(mfc).layout)), seconds)
        unscaled = Costs({k: s for k, s in here.calls.items()})
        here.scale[text] = step_gap(records) / simulate(placed, unscaled).step_seconds
        ran.append(text)
    table.points = [p for p in table.points if p.scale or p.measured]
    mover = _moved_call(exp)
    if table.bandwidth is None and n_workers >= 2 and mover is not None:
        mode = f"{mover.name}:d1m1p1@1,*:d1m1p1"
        logger.info("profiling a reallocation of %s (%s)", mover.role, mode)
        records = run(_short(cfg, mode, "profile-move"))
        table.bandwidth, moved = move_rate(records, mover.role)
        table.model_bytes = _model_bytes(exp, cfg, mover.role, moved)
        ran.append(mode)
    if ran:
        table.save(path, key)
    return table, path, ran


def calibrate_contention(
    cfg: CommonExperimentConfig, exp: ExperimentConfig, table: Profile, path: str, mode: str, run: Runner
) -> float:
    """Run ``mode`` (a plan whose calls overlap on disjoint workers) briefly and find the
    contention at which the simulator replays its measured step; stored in the table at ``path``."""
    placed = with_allocation(exp, mode)
    costs = table.costs(Shape.of(exp))
    if simulate(placed, costs).overlap == 0.0:
        raise ValueError(f"nothing overlaps in {mode}: it cannot measure the contention between workers")
    measured = step_gap(run(_short(cfg, mode, "profile-contention")))

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
    the search's best predictions checked before one is chosen. Returns them and the modes run."""
    here = table.point(Shape.of(exp))
    ran = []
    for mode in modes:
        if mode not in here.measured:
            here.measured[mode] = step_gap(run(_short(cfg, mode, f"verify-{mode}")))
            ran.append(mode)
    if ran:
        with open(path) as f:
            table.save(path, json.load(f)["key"])
    return {m: here.measured[m] for m in modes}, ran


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
    configs = model_configs(exp, _fallback(cfg))
    per_param = moved / param_counts(configs[measured_role], 1)[0]
    return {role: param_counts(c, 1)[0] * per_param for role, c in configs.items() if c is not None}
