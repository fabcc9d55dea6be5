"""Recover points, the model workers' half: each rank writes and reads its part of a point
(layout and choice of points: ``checkpointing``, the master's half)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.model_api import Model, ModelInterface
from realrl.impl.model.backend.checkpoint import load_state, save_state
from realrl.system.checkpointing import RecoverPointError


def _engine(model: Model, role: str):
    engine = model.module
    if not (hasattr(engine, "save") and hasattr(engine, "load")):
        raise TypeError(
            f"model {role!r}: its module ({type(engine).__name__}) has no save(path, extra_state) / load(path); "
            "recover checkpoints need a training engine (backend 'train')"
        )
    return engine


def stateful(interface: ModelInterface) -> bool:
    return callable(getattr(interface, "state_dict", None)) and callable(
        getattr(interface, "load_state_dict", None)
    )


def save_recover(
    model: Model, role: str, interfaces: dict[str, ModelInterface], path: str, step: int | None = None
) -> None:
    """Collective over every rank of the model (each writes its own part)."""
    extra = {
        "version": dataclasses.asdict(model.version),
        "interfaces": {n: i.state_dict() for n, i in interfaces.items() if stateful(i)},
    }
    try:
        _engine(model, role).save(path, extra_state=extra)
    except (OSError, RuntimeError) as e:
        raise _cannot_write(path, e, step, role) from e


def load_recover(
    model: Model, role: str, interfaces: dict[str, ModelInterface], path: str, step: int | None = None
) -> None:
    try:
        extra = _engine(model, role).load(path) or {}
    except (OSError, RuntimeError) as e:
        raise RecoverPointError(f"cannot load {path} ({type(e).__name__}: {e})", step, role) from e
    for field, value in extra.get("version", {}).items():
        setattr(model.version, field, value)
    for name, state in extra.get("interfaces", {}).items():
        if name in interfaces and stateful(interfaces[name]):
            interfaces[name].load_state_dict(state)


def save_interface_state(interface: ModelInterface, path: str, role: str, step: int | None = None) -> None:
    """A frozen role's interface state, written through a temporary file and renamed."""
    tmp = path + ".tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_state(interface.state_dict(), tmp, f"the state of {type(interface).__name__} ({role!r})")
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        raise _cannot_write(path, e, step, role) from e


def _cannot_write(path: str, e: Exception, step: int | None, role: str) -> RecoverPointError:
    return RecoverPointError(
        f"cannot write {path} ({type(e).__name__}: {e}); the previous recover point is unchanged", step, role
    )


def load_interface_state(interface: ModelInterface, path: str, role: str, step: int | None = None) -> None:
    try:
        state: Any = load_state(path)  # tensors, numbers, strings, containers: nothing that runs code
    except (OSError, RuntimeError) as e:
        raise RecoverPointError(f"cannot load {path} ({type(e).__name__}: {e})", step, role) from e
    interface.load_state_dict(state)


def save_samples(sample: SequenceSample, path: str, step: int | None = None) -> None:
    """Samples with their data (a generate call's answers in flight at a recover point), written
    through a temporary file and renamed; nothing in it runs code when read back."""
    state = {
        "ids": list(sample.ids),
        "keys": sorted(sample.keys),
        "trailing_shapes": {k: list(v) for k, v in sample.trailing_shapes.items()},
        "dtypes": dict(sample.dtypes),
        "seqlens": {k: [list(r) for r in v] for k, v in sample.seqlens.items()},
        "data": {k: v for k, v in sample.data.items() if v is not None},
        "metadata": {k: list(v) for k, v in sample.metadata.items()},
    }
    tmp = path + ".tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_state(state, tmp, "the samples in flight")
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        raise RecoverPointError(f"cannot write {path} ({type(e).__name__}: {e})", step) from e


def load_samples(path: str, step: int | None = None) -> SequenceSample:
    try:
        state: Any = load_state(path)
    except (OSError, RuntimeError) as e:
        raise RecoverPointError(f"cannot load {path} ({type(e).__name__}: {e})", step) from e
    return SequenceSample(
        keys=set(state["keys"]),
        trailing_shapes={k: tuple(v) for k, v in state["trailing_shapes"].items()},
        dtypes=state["dtypes"],
        ids=state["ids"],
        seqlens=state["seqlens"],
        data=state["data"],
        metadata=state["metadata"],
    )
