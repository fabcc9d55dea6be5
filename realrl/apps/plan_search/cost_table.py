"""The plan search's table of measured costs and its cache: what a call's seconds depend on, the
points measured, and the costs at a shape read from them.

The table is cached in ``<fileroot>/plan_profiles/`` under a key of the experiment, its models,
its interfaces and the hardware (``profile_key``), with one point per batch shape measured (each
call's sequences per step, the prompt and answer lengths: a ``Shape``). A search at a shape
measured before runs nothing; at a new shape it interpolates each call's seconds linearly in the
tokens the call processes from two measured shapes within reach (``REACH``), and measures only
what it cannot interpolate (the runs that fill the table: ``profiles.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import statistics
from typing import Any

from realrl.api.core.model_size import model_configs
from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.api.quickstart.memory_plan import batch_shape
from realrl.apps.plan_search.simulator import Costs
from realrl.impl.model.backend.integrity import write_json_atomic


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
    fallback = task_fallback(cfg)
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
        if dataclasses.is_dataclass(value) and not isinstance(value, type):  # typed hyperparameters
            value = dataclasses.asdict(value)
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in SHAPE_KEYS}
        return value

    return repr((impl.type_, strip(impl.args))) if hasattr(impl, "args") else repr(impl)


def task_fallback(cfg: CommonExperimentConfig) -> dict | None:
    """An embedded task's model (what its checkpoints not trained yet will hold); None without a task."""
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
    """The measured shapes (``points``), the moves' bandwidth, each model's bytes per move, the
    contention between workers computing side by side (None: not measured yet) with the plan
    whose run measured it, and a short run's wall seconds on this machine (the median of the
    last search's runs: what the next search's plan of work estimates its runs at)."""

    points: list[Point] = dataclasses.field(default_factory=list)
    bandwidth: float | None = None
    model_bytes: dict[str, float] = dataclasses.field(default_factory=dict)
    contention: float | None = None
    contention_plan: str | None = None  # the plan whose run measured it
    run_seconds: float | None = None  # a short run's wall seconds (None: none timed yet)

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
            "run_seconds": self.run_seconds,
        }

    @classmethod
    def from_json(cls, raw: dict) -> Profile:
        points = [Point.from_json(p) for p in raw.get("points", [])]
        model_bytes = {k: float(v) for k, v in raw.get("model_bytes", {}).items()}
        return cls(
            points,
            raw.get("bandwidth"),
            model_bytes,
            raw.get("contention"),
            raw.get("contention_plan"),
            raw.get("run_seconds"),
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
