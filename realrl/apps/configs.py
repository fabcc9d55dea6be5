"""Command-line overrides -> an experiment's config: presets, the embedded task, the user's own.

The order is the rule: ``experiment_name``, then the embedded task's recipe (only when the user
names no dataset path: its options, its files, the checkpoints of the phases it builds on), then
``ppo_preset=<name>`` expanded into ``ppo.*`` options, then the user's overrides, so whatever the
user writes wins. This is the one place a task is applied; the experiments read plain paths.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from realrl.api.quickstart.entrypoint import get_quickstart_exp, quickstart_experiments
from realrl.apps.errors import UserError
from realrl.apps.overrides import merge, override_key, parse_values, to_object
from realrl.base import plugins
from realrl.base.registry import UnknownNameError
from realrl.experiments.tasks import DEFAULT_TASK, EmbeddedTask, get_task, task_names
from realrl.impl.interface.ppo_config import PRESET_EXPERIMENT_OPTIONS, PRESETS

DATA_PATH_KEYS = ("dataset.train_path", "dataset.path")
PRESET_KEY = "ppo_preset"
TASK_KEY = "task"


def register_everything(overrides: list[str] = ()) -> None:
    """Import what registers by name: realrl's own experiments and implementations, the
    installed packages' plugins (``realrl.plugins`` entry points) and the modules of the user's
    ``import_modules=[...]`` override, so a user's experiment (``my-ppo``) is found by name."""
    import realrl.experiments  # noqa: F401
    import realrl.impl  # noqa: F401

    plugins.load_entry_points()
    for o in overrides:
        if override_key(o) == "import_modules":
            modules = [str(m) for m in parse_values([o]).import_modules]
            for i, m in enumerate(modules):
                if m.endswith(".py") and not os.path.isfile(m):
                    raise UserError(f"import_modules[{i}]={m!r}: no such file")
            try:
                plugins.import_modules(modules)
            except Exception as e:  # noqa: BLE001 - the user's module: one line naming it
                raise UserError(f"{o}: cannot import it: {type(e).__name__}: {e}") from e


def chosen_task(experiment: str, user: list[str]) -> EmbeddedTask | None:
    """The embedded task of a command line: None when it names a dataset path (the user's data),
    else ``task=<name>`` or the default."""
    values = {override_key(o): o.split("=", 1)[1].strip().strip("'\"") for o in user}
    data_keys = [k for k in DATA_PATH_KEYS if values.get(k)]
    name = values.get(TASK_KEY)
    if data_keys:
        if name not in (None, "", "null"):
            raise UserError(
                f"task={name} runs on the task's own data, but {data_keys[0]} names a file; drop one of them"
            )
        return None
    try:
        task = get_task(DEFAULT_TASK if name in (None, "", "null") else name)
    except UnknownNameError:
        raise UserError(f"task={name!r} is not an embedded task; choose one of {task_names()}") from None
    try:
        task.recipe(experiment)
    except ValueError as e:
        raise UserError(str(e)) from None
    return task


def preset_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """Expand ``ppo_preset=<name>`` into ``ppo.*`` overrides (and the experiment options the
    preset sets, such as a learning-rate schedule) placed before the user's own."""
    rest, expanded = [], []
    for o in overrides:
        if override_key(o) != PRESET_KEY:
            rest.append(o)
            continue
        name = o.split("=", 1)[1].strip().strip("'\"")
        if name not in PRESETS:
            raise UserError(f"{PRESET_KEY}={name!r} is not a preset; choose one of {sorted(PRESETS)}")
        for key, value in PRESETS[name]().items():
            if dataclasses.is_dataclass(value):
                expanded += [f"ppo.{key}.{k}={_fmt(v)}" for k, v in dataclasses.asdict(value).items()]
            else:
                expanded.append(f"ppo.{key}={_fmt(value)}")
        expanded += PRESET_EXPERIMENT_OPTIONS.get(name, [])
    return expanded, rest


def _fmt(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value) if any(c in value for c in " ,=.") else value
    return str(value).lower() if isinstance(value, bool) else str(value)


def config_node(name: str, overrides: list[str]) -> tuple[Any, list[str]]:
    """The experiment's omegaconf node, interpolations not resolved (what ``--cfg job`` shows),
    and the user's own overrides (the presets expanded out of them)."""
    register_everything(overrides)
    if name not in quickstart_experiments():
        raise UserError(f"unknown experiment {name!r}; choose one of {quickstart_experiments()}")
    cls = get_quickstart_exp(name)
    expanded, user = preset_overrides(overrides)
    head = [f"experiment_name={name}"]
    task = chosen_task(name, user)
    if task is not None:  # its paths hang off fileroot and seed: read them as the user set them
        first = merge(cls, head + expanded + user, user)
        head += task.overrides(name, str(first.fileroot), int(first.seed))
    return merge(cls, head + expanded + user, user), user


def build_config(name: str, overrides: list[str]) -> Any:
    """The experiment's config object from ``overrides``: every key, type and value checked, a
    mistake a ``UserError`` naming the override (``realrl.apps.overrides``). hydra's
    ``+key=value``, which adds a key to a dict option such as ``manual``, is taken too."""
    node, user = config_node(name, overrides)
    return to_object(node, user)
