"""Checkpoints the runtime writes: HF-format models for users, recover points for resuming.

Layout under the run folder:
  checkpoints/<role>/step<k>/, checkpoints/<role>/final/   ``interface.save``: HF weights + tokenizer
  recover/step<k>/<role>/                                  ``engine.save``: weights, optimizer, schedule,
                                                           and (extra state) model version + interface states
  recover/latest.json                                      {"step": k}: written last, so a recover
                                                           point counts only once all of it is on disk

Data positions need no saving: a worker's data order is a function of (seed, epoch, dp rank), and
the master derives epoch and position from the step counter. Nor does RNG: every call reseeds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

from realrl.api.core.model_api import Model, ModelInterface

LATEST = "latest.json"


def hf_dir(run_dir: str, role: str, step: int | None) -> str:
    return os.path.join(run_dir, "checkpoints", role, "final" if step is None else f"step{step}")


def recover_root(run_dir: str) -> str:
    return os.path.join(run_dir, "recover")


def recover_dir(run_dir: str, step: int, role: str) -> str:
    return os.path.join(recover_root(run_dir), f"step{step}", role)


def latest_recover_step(run_dir: str) -> int | None:
    """Steps completed at the last complete recover point, or None."""
    try:
        with open(os.path.join(recover_root(run_dir), LATEST)) as f:
            return int(json.load(f)["step"])
    except FileNotFoundError:
        return None


def mark_recover_point(run_dir: str, step: int) -> None:
    """Publish ``step`` as the latest recover point (atomic rename), then drop older ones."""
    root = recover_root(run_dir)
    tmp = os.path.join(root, LATEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step}, f)
    os.replace(tmp, os.path.join(root, LATEST))
    for name in os.listdir(root):
        if name.startswith("step") and name != f"step{step}":
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _engine(model: Model, role: str):
    engine = model.module
    if not (hasattr(engine, "save") and hasattr(engine, "load")):
        raise TypeError(
            f"model {role!r}: its module ({type(engine).__name__}) has no save(path, extra_state) / load(path); "
            "recover checkpoints need a training engine (backend 'train')"
        )
    return engine


def save_recover(model: Model, role: str, interfaces: dict[str, ModelInterface], path: str) -> None:
    """Collective over every rank of the model (each writes its own part)."""
    extra = {
        "version": dataclasses.asdict(model.version),
        "interfaces": {n: i.state_dict() for n, i in interfaces.items() if hasattr(i, "state_dict")},
    }
    _engine(model, role).save(path, extra_state=extra)


def load_recover(model: Model, role: str, interfaces: dict[str, ModelInterface], path: str) -> None:
    extra = _engine(model, role).load(path) or {}
    for field, value in extra.get("version", {}).items():
        setattr(model.version, field, value)
    for name, state in extra.get("interfaces", {}).items():
        if name in interfaces and hasattr(interfaces[name], "load_state_dict"):
            interfaces[name].load_state_dict(state)
