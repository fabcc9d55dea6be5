"""The paths a run reads, checked before any worker starts (and before the phases a run builds
on): a typo in a data file or a model folder is then a one-line error naming the key at once,
not a worker's traceback minutes later. Only what the user gave is checked; an embedded task's own
files and checkpoints are made by the run itself."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from realrl.apps.errors import UserError
from realrl.impl.dataset.sources import DATA_SUFFIXES

HF_CONFIG = "config.json"
# options naming user code as "file.py:name" (or "module:name", imported only by the workers)
PLUGIN_KEYS = ("reward_fn", "env", "agent")


def check_paths(cfg: Any, task_paths: dict[str, str] | None = None) -> None:
    """Every data file, model folder, tokenizer folder and plugin file named in ``cfg`` (a
    quickstart config dataclass) exists and has the right kind; ``task_paths`` (key -> path) are
    an embedded task's, left alone while they still hold that path."""
    from realrl.experiments.common import ModelTrainEvalConfig

    theirs = task_paths or {}

    def given(key: str, value: Any) -> bool:
        return bool(value) and theirs.get(key) != value

    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), f.name
        if isinstance(value, ModelTrainEvalConfig):
            if given(f"{key}.path", value.path):
                check_model_folder(f"{key}.path", value.path)
        elif f.name == "dataset" and dataclasses.is_dataclass(value):
            for g in dataclasses.fields(value):
                path = getattr(value, g.name)
                if g.name.endswith("path") and isinstance(path, str) and given(f"{key}.{g.name}", path):
                    check_data_path(f"{key}.{g.name}", path)
        elif f.name == "tokenizer_path" and given(key, value):
            check_tokenizer_folder(key, value)
        elif f.name in PLUGIN_KEYS and isinstance(value, str) and ":" in value:
            check_plugin_file(key, value)
        elif f.name == "import_modules":
            for i, module in enumerate(value):
                if module.endswith(".py") and not os.path.isfile(module):
                    raise UserError(f"{key}[{i}]={module!r}: no such file")


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
