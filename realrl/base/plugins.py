"""Plugins: the user's modules and installed packages that register datasets, models, interfaces,
reward functions, estimators or experiments by name.

Two ways in, both read by the command line and by every worker before anything is built:
``import_modules=[pkg.module, path/to/file.py]`` on the command line, and the entry-point group
``realrl.plugins`` of an installed package (in its ``pyproject.toml``:
``[project.entry-points."realrl.plugins"] mine = "my_package.realrl_plugin"``). An entry point
names a module (importing it registers) or a function (called with no arguments).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import traceback

ENTRY_POINT_GROUP = "realrl.plugins"


def module_name(mod: str) -> str:
    """The name ``import_modules`` imports ``mod`` under: a dotted name as it is, a ``.py``
    file as ``realrl_plugin_<its stem>``."""
    if mod.endswith(".py"):
        return "realrl_plugin_" + os.path.splitext(os.path.basename(mod))[0]
    return mod


def import_modules(modules: list[str]) -> None:
    """Import each dotted module name or ``.py`` file once per process."""
    for mod in modules:
        if mod.endswith(".py"):
            path = os.path.abspath(mod)
            name = module_name(path)
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot import plugin file {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        else:
            importlib.import_module(mod)


def load_attribute(spec: str) -> object:
    """What ``package.module:attr`` or ``path/to/file.py:attr`` names (``attr`` may be dotted):
    how a user points an option at a function or class of their own."""
    module_name_, sep, attr = spec.rpartition(":")
    if not sep or not module_name_ or not attr:
        raise ValueError(f"{spec!r} is not 'package.module:name' or 'file.py:name'")
    if module_name_.endswith(".py"):
        if not os.path.isfile(module_name_):
            raise FileNotFoundError(f"no such file {module_name_!r}")
        import_modules([module_name_])
        module: object = sys.modules[module_name(os.path.abspath(module_name_))]
    else:
        module = importlib.import_module(module_name_)
    for part in attr.split("."):
        module = getattr(module, part)
    return module


def failure_message(error: BaseException, source: str | None = None) -> str:
    """Where a plugin failed to import, in one line: ``<file>, line <n>: <type>: <message>``. The
    line is the one of ``source`` (the plugin's file) the error came from, else the deepest frame
    of the imported code (a module the plugin imports); none for a module that is not found."""
    what = f"{type(error).__name__}: {error}"
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}, line {error.lineno}: {type(error).__name__}: {error.msg}"
    frames = traceback.extract_tb(error.__traceback__)
    machinery = [i for i, f in enumerate(frames) if _is_import_machinery(f.filename)]
    # the importing code's own frames come before the first import frame: not the plugin's
    frames = [f for f in frames[machinery[0] if machinery else 0 :] if not _is_import_machinery(f.filename)]
    own = [f for f in frames if source and os.path.abspath(f.filename) == os.path.abspath(source)]
    where = (own or frames)[-1:] if frames else []
    return f"{where[0].filename}, line {where[0].lineno}: {what}" if where else what


def _is_import_machinery(filename: str) -> bool:
    return filename.startswith("<frozen") or os.path.dirname(filename) == os.path.dirname(importlib.__file__)


def missing_name_message(owner: object, name: str, where: str) -> str:
    """``where`` has no ``name``: the message, with the closest public name ``owner`` has."""
    public = [n for n in dir(owner) if not n.startswith("_")]
    close = difflib.get_close_matches(name, public, n=1)
    return f"{where} has no {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")


def module_exists(name: str) -> bool:
    """Whether module ``name`` can be found, without executing it or the packages above it that
    are not imported yet (their ``__init__`` may import heavy libraries). A namespace package
    cannot be walked so: True (the import that runs the module tells)."""
    parts = name.split(".")
    known = next((i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in sys.modules), 0)
    if known == len(parts):
        return True
    if known:
        spec = sys.modules[".".join(parts[:known])].__spec__
    else:
        spec, known = importlib.machinery.PathFinder.find_spec(parts[0]), 1
    for depth in range(known, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return False
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), list(locations))
        except KeyError:  # a namespace package's path needs its parent imported
            return True
    return spec is not None


@functools.cache
def load_entry_points() -> tuple[str, ...]:
    """Load every ``realrl.plugins`` entry point of the installed packages, once per process
    (the registries reject a second registration); the names loaded."""
    names = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = ep.load()
        except Exception as e:  # noqa: BLE001 - re-raised naming the plugin
            raise ImportError(
                f"realrl plugin {ep.name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}"
            ) from e
        if callable(target):
            target()
        names.append(ep.name)
    return tuple(names)


def entry_point_modules() -> tuple[str, ...]:
    """The modules the installed packages' ``realrl.plugins`` entry points name."""
    return tuple(ep.module for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def import_plugins(modules: list[str]) -> tuple[str, ...]:
    """Load the installed packages' plugins and import the user's ``modules`` (dotted names or
    ``.py`` paths); the names of the plugin modules, whose classes a config may hold. What a
    plugin imports is its own: one that imports torch at its top brings torch into the master."""
    load_entry_points()
    import_modules(modules)
    return (*entry_point_modules(), *map(module_name, modules))
