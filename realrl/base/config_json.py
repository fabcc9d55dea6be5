"""Configs as JSON: the worker configs a run hands its workers and the experiment config it saves.

A pickle runs whatever code its bytes name when it is loaded; these files are data. A dataclass
or an enum is written with the name of its class, and read back only if that class is a
dataclass (or enum) of realrl or of a plugin module the reader imported first (the user's own
code, which every worker imports anyway): nothing else is imported, and no constructor,
``__post_init__`` or ``__setstate__`` runs. A dataclass comes back with exactly the attributes it
was written with, as unpickling gives them.

Tags, for what JSON cannot say directly: ``{"$dataclass": "module:Qualname", "attrs": {...}}``,
``{"$enum": "module:Qualname", "value": ...}``, ``{"$tuple": [...]}``, ``{"$set": [...]}``,
``{"$frozenset": [...]}``, ``{"$bytes": "<hex>"}``, ``{"$items": [[key, value], ...]}`` (a dict
whose keys are not all strings, or one that uses a tag as a key). Floats keep ``NaN`` and
``Infinity`` as Python's ``json`` writes them.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

FORMAT = "realrl-config/1"
TAGS = ("$dataclass", "$enum", "$tuple", "$set", "$frozenset", "$bytes", "$items")


class ConfigFormatError(ValueError):
    """A value that cannot be written as a config, or a file that is not one; the message names
    where (``value.models['actor'].backend``) and what."""


def dumps(value: Any, plugin_modules: Iterable[str] = ()) -> str:
    """``value`` as the text of a config file; ``plugin_modules``: what the reader must import
    before it can rebuild the plugins' classes (``import_modules`` of the config)."""
    doc = {"format": FORMAT, "plugin_modules": list(plugin_modules), "value": _encode(value, "value")}
    return json.dumps(doc, indent=1, sort_keys=False)


def loads(text: str | bytes, import_plugins: Callable[[list[str]], Iterable[str]] | None = None) -> Any:
    """The value ``dumps`` wrote. ``import_plugins(modules)`` imports the file's plugin modules
    first and returns the names of the modules whose classes the value may hold besides realrl's
    (without it, only realrl's classes are rebuilt)."""
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigFormatError(f"not a JSON config ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigFormatError(f"not a realrl config: its top-level 'format' must be {FORMAT!r}")
    plugins = doc.get("plugin_modules") or []
    if not isinstance(plugins, list) or not all(isinstance(m, str) for m in plugins):
        raise ConfigFormatError("'plugin_modules' must be a list of module names or .py paths")
    allowed = tuple(import_plugins(plugins)) if import_plugins is not None else ()
    return _decode(doc.get("value"), "value", allowed)


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, enum.Enum):  # first: a str or int enum is a str or int too
        return {"$enum": _class_name(value), "value": _encode(value.value, f"{where}.value")}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        attrs = (
            vars(value)
            if hasattr(value, "__dict__")
            else {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        )
        return {
            "$dataclass": _class_name(value),
            "attrs": {k: _encode(v, f"{where}.{k}") for k, v in attrs.items()},
        }
    if isinstance(value, list):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, set | frozenset):
        tag = "$frozenset" if isinstance(value, frozenset) else "$set"
        return {tag: [_encode(v, f"{where}{{}}") for v in sorted(value, key=repr)]}
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k in TAGS for k in value):
            return {k: _encode(v, f"{where}[{k!r}]") for k, v in value.items()}
        return {
            "$items": [
                [_encode(k, f"{where} key {k!r}"), _encode(v, f"{where}[{k!r}]")] for k, v in value.items()
            ]
        }
    raise ConfigFormatError(
        f"{where}: a {type(value).__module__}.{type(value).__qualname__} cannot be written in a config "
        "(numbers, strings, lists, dicts, tuples, sets, enums and dataclasses can)"
    )


def _class_name(value: Any) -> str:
    cls = type(value)
    if "<locals>" in cls.__qualname__:
        raise ConfigFormatError(f"{cls.__qualname__} is defined inside a function: a config cannot name it")
    return f"{cls.__module__}:{cls.__qualname__}"


def _decode(value: Any, where: str, plugins: tuple[str, ...]) -> Any:
    if isinstance(value, list):
        return [_decode(v, f"{where}[{i}]", plugins) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    tag = next((t for t in TAGS if t in value), None)
    if tag is None:
        return {k: _decode(v, f"{where}[{k!r}]", plugins) for k, v in value.items()}
    body = value[tag]
    if tag == "$dataclass":
        cls = _allowed_class(body, where, plugins, dataclass=True)
        attrs = value.get("attrs")
        if not isinstance(attrs, dict):
            raise ConfigFormatError(f"{where}: a dataclass needs its 'attrs'")
        obj = object.__new__(cls)
        for k, v in attrs.items():  # as unpickling does: no __init__, exactly these attributes
            object.__setattr__(obj, k, _decode(v, f"{where}.{k}", plugins))
        return obj
    if tag == "$enum":
        cls = _allowed_class(body, where, plugins, dataclass=False)
        try:
            return cls(_decode(value.get("value"), f"{where}.value", plugins))
        except ValueError as e:
            raise ConfigFormatError(f"{where}: {e}") from None
    if not isinstance(body, list | str):
        raise ConfigFormatError(f"{where}: {tag} holds a {type(body).__name__}")
    if tag == "$bytes":
        try:
            return bytes.fromhex(body)
        except (TypeError, ValueError):
            raise ConfigFormatError(f"{where}: $bytes must be hex digits") from None
    items = [_decode(v, f"{where}[{i}]", plugins) for i, v in enumerate(body)]
    if tag == "$items":
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in items):
            raise ConfigFormatError(f"{where}: $items must be [key, value] pairs")
        try:
            return {_hashable(k): v for k, v in items}
        except TypeError as e:
            raise ConfigFormatError(f"{where}: {e}") from None
    try:
        return {"$tuple": tuple, "$set": set, "$frozenset": frozenset}[tag](items)
    except TypeError as e:
        raise ConfigFormatError(f"{where}: {e}") from None


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _allowed_class(name: Any, where: str, plugins: tuple[str, ...], dataclass: bool) -> type:
    """The class ``module:Qualname`` names, if it is realrl's or a plugin's dataclass (enum)."""
    if not isinstance(name, str) or name.count(":") != 1:
        raise ConfigFormatError(f"{where}: {name!r} is not a 'module:Qualname' class name")
    module_name, qualname = name.split(":")
    ours = module_name == "realrl" or module_name.startswith("realrl.")
    theirs = any(module_name == p or module_name.startswith(p + ".") for p in plugins)
    if not (ours or theirs):
        raise ConfigFormatError(
            f"{where}: refusing class {name}: a config names only realrl's classes and its plugins' "
            f"({', '.join(plugins) or 'none'})"
        )
    try:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigFormatError(f"{where}: cannot import {module_name} ({e})") from None
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    kind_ok = (
        dataclasses.is_dataclass(obj) if dataclass else isinstance(obj, type) and issubclass(obj, enum.Enum)
    )
    if not isinstance(obj, type) or not kind_ok:
        what = "dataclass" if dataclass else "enum"
        raise ConfigFormatError(f"{where}: {name} is not a {what}")
    return obj
