"""What each call costs in each layout, measured by short runs and cached: the plan search's input.

For every layout the search may give a call, one short run of the experiment places every call
in that layout (``allocation_mode=<layout>``) and records each call's seconds (the median of its
``timing`` over the steps after the first two, which include warm-up), scaled so that the
simulator replays that run's own measured step: the workers' call times leave out the master's
round trips between calls, and a tensor-parallel rank's time counts its wait for its partner. One more run on two workers
puts a trained model's generate call on a worker of its own, and its reallocations give the
bandwidth a move of weights gets (bytes over seconds moving) and the bytes one move of that model
takes; the other models' bytes follow from their parameter counts. Runs go under
``<fileroot>/<experiment>-profile/``; the table is cached in ``<fileroot>/plan_profiles/`` under
a key of the experiment, its models, its batch shapes and the hardware, and reused by every
search with the same key. A cached table lacking a layout gets only that layout's run.
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
from realrl.api.quickstart.memory_plan import model_configs, param_counts
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
    """The experiment, its models' architectures, its calls' batch shapes and interfaces, the
    device and the hardware: what the measured seconds depend on."""
    fallback = _fallback(cfg)
    models = {
        role: None if c is None else dataclasses.asdict(c) for role, c in model_configs(exp, fallback).items()
    }
    calls = {
        m.name: {"n_seqs": m.n_seqs, "interface": repr(m.interface_impl), "type": m.interface_type.value}
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


def _fallback(cfg: CommonExperimentConfig) -> dict | None:
    if not cfg.task:
        return None
    from realrl.experiments.tasks import get_task

    return get_task(cfg.task).model_config()


@dataclasses.dataclass
class Profile:
    """Seconds per (call, layout), the moves' bandwidth and each model's bytes per move."""

    calls: dict[tuple[str, str], float]
    bandwidth: float | None = None
    model_bytes: dict[str, float] = dataclasses.field(default_factory=dict)
    # per layout: the profiling run's measured step over the one the simulator makes of its
    # calls' seconds; the calls' costs in that layout are scaled by it
    scale: dict[str, float] = dataclasses.field(default_factory=dict)

    def costs(self) -> Costs:
        calls = {(m, layout): s * self.scale.get(layout, 1.0) for (m, layout), s in self.calls.items()}
        return Costs(calls, dict(self.model_bytes), self.bandwidth or 1e12)

    def to_json(self, key: dict) -> dict:
        return {
            "key": key,
            "calls": {f"{m}|{layout}": s for (m, layout), s in sorted(self.calls.items())},
            "bandwidth": self.bandwidth,
            "model_bytes": self.model_bytes,
            "scale": self.scale,
        }

    @classmethod
    def from_json(cls, raw: dict) -> Profile:
        calls = {tuple(k.split("|", 1)): float(v) for k, v in raw["calls"].items()}
        model_bytes = {k: float(v) for k, v in raw.get("model_bytes", {}).items()}
        return cls(calls, raw.get("bandwidth"), model_bytes, dict(raw.get("scale", {})))


def cache_path(fileroot: str, key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return os.path.join(fileroot, "plan_profiles", f"{key['experiment']}-{digest}.json")


Runner = Callable[[CommonExperimentConfig], list[dict]]


def profile(
    name: str,
    cfg: CommonExperimentConfig,
    exp: ExperimentConfig,
    layouts: list[Layout],
    n_workers: int,
    run: Runner,
) -> tuple[Profile, str, list[str]]:
    """The cached table for ``cfg``, completed by a run for each layout it lacks (and the
    bandwidth run on 2+ workers when it has none). ``run(config)``: runs one short experiment and
    returns its step records. Returns the table, its file and the runs it took (labels)."""
    key = profile_key(name, exp, cfg)
    path = cache_path(cfg.fileroot, key)
    table = Profile({})
    if os.path.isfile(path):
        with open(path) as f:
            table = Profile.from_json(json.load(f))
    ran = []
    for layout in layouts:
        text = str(layout)
        if text in table.scale:
            continue
        logger.info("profiling every call of %s in layout %s (%d steps)", name, text, PROFILE_STEPS)
        placed = with_allocation(exp, text)  # a call that sees the whole batch stays on one worker
        records = run(_short(cfg, text, f"profile-{text}"))
        graph = {m.name for m in exp.mfcs}  # "eval" and the like are no calls of the graph
        for mfc, seconds in call_seconds(records).items():
            if mfc in graph:
                table.calls.setdefault((mfc, str(placed.call_placement(mfc).layout)), seconds)
        table.scale[text] = step_gap(records) / simulate(placed, Costs(dict(table.calls))).step_seconds
        ran.append(text)
    mover = _moved_call(exp)
    if table.bandwidth is None and n_workers >= 2 and mover is not None:
        mode = f"{mover.name}:d1m1p1@1,*:d1m1p1"
        logger.info("profiling a reallocation of %s (%s)", mover.role, mode)
        records = run(_short(cfg, mode, "profile-move"))
        table.bandwidth, moved = move_rate(records, mover.role)
        table.model_bytes = _model_bytes(exp, cfg, mover.role, moved)
        ran.append(mode)
    if ran:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomic(path, table.to_json(key))
    return table, path, ran


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
