"""The paths a run reads and the user's plugins, checked before any worker starts (and before
the phases a run builds on, and before the experiment's own checks): a typo in a data file or a
model folder, a plugin file that does not import or names no such class, is then a one-line error
naming the key at once, not a worker's traceback minutes later. Only what the user gave is
checked; an embedded task's own files and checkpoints are made by the run itself.

The user's plugins (``env=``, ``agent=``, ``reward_fn=`` as ``file.py:name`` or ``module:name``,
and ``import_modules``) are imported here, in the command line's process: what such a file
imports comes with it (torch, if it imports torch). realrl's own modules named so are only looked
up, not run, so that the command line stays free of torch (``plugins.module_exists``)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Any

from realrl.apps.errors import UserError
from realrl.base import plugins
from realrl.impl.dataset.sources import DATA_SUFFIXES

HF_CONFIG = "config.json"
# options naming user code as "file.py:name" (or "module:name", imported only by the workers)
PLUGIN_KEYS = ("reward_fn", "env", "agent")
CLASS_KEYS = ("env",)  # the others name a function (anything callable)


def check_paths(cfg: Any, task_paths: dict[str, str] | None = None) -> None:
    """Every data file, model folder, tokenizer folder and plugin file named in ``cfg`` (a
    quickstart config dataclass, or its omegaconf node) exists and has the right kind, and every
    plugin imports (``check_plugin``); ``task_paths`` (key -> path) are an embedded task's, left
    alone while they still hold that path."""
    from realrl.experiments.common import ModelTrainEvalConfig

    theirs = task_paths or {}

    def given(key: str, value: Any) -> bool:
        return bool(value) and theirs.get(key) != value

    plugin_specs = []
    for key, kind, value in _fields(cfg):
        if issubclass(kind, ModelTrainEvalConfig):
            if given(f"{key}.path", value.path):
                check_model_folder(f"{key}.path", value.path)
        elif key == "dataset" and dataclasses.is_dataclass(kind):
            for name, _, path in _fields(value):
                if name.endswith("path") and isinstance(path, str) and given(f"{key}.{name}", path):
                    check_data_path(f"{key}.{name}", path)
        elif key == "tokenizer_path" and given(key, value):
            check_tokenizer_folder(key, value)
        elif key in PLUGIN_KEYS and isinstance(value, str) and ":" in value:
            check_plugin_file(key, value)
            plugin_specs.append((key, value))
        elif key == "import_modules":
            check_import_modules(key, [str(m) for m in value])
    for key, spec in plugin_specs:  # imported once every path is known to exist
        check_plugin(key, spec)


def check_node(name: str, node: Any) -> None:
    """``check_paths`` on experiment ``name``'s omegaconf node, before its config is built: a
    missing file is named before what the experiment's own checks would say of the options (an
    embedded task's paths left alone). A value that does not resolve is left to the build."""
    from omegaconf.errors import OmegaConfBaseException

    from realrl.experiments.tasks import get_task

    try:
        task = get_task(node.task) if node.get("task") else None
        provided = task.provided(name, str(node.fileroot), int(node.seed)) if task else {}
        check_paths(node, provided)
    except OmegaConfBaseException:
        return


def _fields(cfg: Any) -> list[tuple[str, type, Any]]:
    """(name, type, value) of every field of a config dataclass, or of its omegaconf node."""
    if dataclasses.is_dataclass(cfg):
        return [(f.name, type(getattr(cfg, f.name)), getattr(cfg, f.name)) for f in dataclasses.fields(cfg)]
    from omegaconf import OmegaConf

    cls = OmegaConf.get_type(cfg)
    return [
        (f.name, OmegaConf.get_type(cfg, f.name) or object, getattr(cfg, f.name))
        for f in dataclasses.fields(cls)
    ]


def check_import_modules(key: str, modules: list[str]) -> None:
    """Every file exists, then every module imports (in order, as the workers import them)."""
    for i, module in enumerate(modules):
        if module.endswith(".py") and not os.path.isfile(module):
            raise UserError(f"{key}[{i}]={module!r}: no such file")
    for i, module in enumerate(modules):
        try:
            plugins.import_modules([module])
        except Exception as e:  # noqa: BLE001 - the user's module: one line naming where it failed
            source = module if module.endswith(".py") else None
            raise UserError(
                f"{key}[{i}]={module!r}: cannot import it: {plugins.failure_message(e, source)}"
            ) from e


def check_data_path(key: str, path: str) -> None:
    if not os.path.exists(path):
        raise UserError(f"{key}={path!r}: no such file or folder")
    suffix = os.path.splitext(path)[1].lower()
    if os.path.isfile(path) and suffix not in DATA_SUFFIXES:
        raise UserError(
            f"{key}={path!r}: unsupported file type {suffix!r}; expected {', '.join(DATA_SUFFIXES)} "
            "or a folder written by datasets' save_to_disk"
        )


def check_model_folder(key: str, path: str) -> None:
    expected = f"expected a local Hugging Face checkpoint folder (with {HF_CONFIG})"
    if not os.path.exists(path):
        raise UserError(f"{key}={path!r}: no such folder; {expected}")
    if not os.path.isdir(path):
        raise UserError(f"{key}={path!r}: is a file; {expected}")
    if not os.path.isfile(os.path.join(path, HF_CONFIG)):
        raise UserError(f"{key}={path!r}: has no {HF_CONFIG}; {expected}")


def check_tokenizer_folder(key: str, path: str) -> None:
    if not os.path.isdir(path):
        what = "is a file" if os.path.exists(path) else "no such folder"
        raise UserError(f"{key}={path!r}: {what}; expected a Hugging Face tokenizer folder")


def check_plugin_file(key: str, spec: str) -> None:
    """``file.py:name``: the file exists (a ``module:name`` is the workers' to import)."""
    path, _, name = spec.rpartition(":")
    if path.endswith(".py") and not os.path.isfile(path):
        raise UserError(f"{key}={spec!r}: no such file {path!r}")
    if not name:
        raise UserError(f"{key}={spec!r}: expected <file.py or module>:<name>")


def check_plugin(key: str, spec: str) -> None:
    """``file.py:name`` or ``module:name`` imports and names a class (``env``) or a function:
    the file, line and error of a module that does not import, the closest name to one it lacks.
    A module of realrl's own is only looked up unless already imported (it may import torch)."""
    module_spec, _, attr = spec.rpartition(":")
    is_file = module_spec.endswith(".py")
    if not is_file and module_spec.split(".")[0] == "realrl" and module_spec not in sys.modules:
        if not plugins.module_exists(module_spec):
            raise UserError(f"{key}={spec!r}: no module {module_spec!r}")
        return
    try:
        if is_file:
            plugins.import_modules([module_spec])
            target: object = sys.modules[plugins.module_name(os.path.abspath(module_spec))]
        else:
            target = importlib.import_module(module_spec)
    except ModuleNotFoundError as e:
        if e.name is None or not f"{module_spec}.".startswith(f"{e.name}."):
            raise UserError(
                f"{key}={spec!r}: cannot import {module_spec}: {plugins.failure_message(e, _origin(module_spec))}"
            ) from e
        raise UserError(f"{key}={spec!r}: no module {e.name!r}") from e
    except Exception as e:  # noqa: BLE001 - the user's module: one line naming where it failed
        source = module_spec if is_file else _origin(module_spec)
        raise UserError(
            f"{key}={spec!r}: cannot import {module_spec}: {plugins.failure_message(e, source)}"
        ) from e
    where = module_spec
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UserError(f"{key}={spec!r}: {plugins.missing_name_message(target, part, where)}")
        target, where = getattr(target, part), f"{where}:{part}"
    if key in CLASS_KEYS and not isinstance(target, type):
        raise UserError(f"{key}={spec!r}: is a {type(target).__name__}, not a class")
    if not callable(target):
        raise UserError(f"{key}={spec!r}: is a {type(target).__name__}, not a function")


def _origin(module: str) -> str | None:
    """The file of ``module`` (None when it cannot be found)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None
