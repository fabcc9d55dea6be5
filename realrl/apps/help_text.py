"""The command lines' ``--help``, generated from what those command lines read.

The quickstart's help lists the experiment registry (each with its summary and the option groups
its config really has), the embedded-task registry (each with the experiments it runs) and the PPO
presets; ``realrl.apps.search`` lists its config dataclass's fields with their ``search.`` names,
defaults and ``help`` sentences. A new experiment, task, preset or option therefore shows up in
``--help`` without anyone editing a list here. Every description is whole sentences in plain text:
reStructuredText markup is stripped, and a docstring gives its first whole sentence, never a line
cut where the docstring happened to wrap.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import textwrap
from typing import Any

from realrl.api.quickstart.entrypoint import get_quickstart_exp, quickstart_experiments
from realrl.experiments.tasks import DEFAULT_TASK, get_task, task_names
from realrl.impl.interface.ppo_presets import PRESETS

WIDTH = 100  # prose paragraphs wrap here; one-line descriptions are never cut
_MARKUP = re.compile(r"``(.+?)``|(?<![\w`])`([^`]+)`(?![\w`])")
_ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "cf.", "etc.")


def plain(text: str) -> str:
    """``text`` as one line of plain text: reStructuredText literals unquoted, whitespace collapsed."""
    return " ".join(_MARKUP.sub(lambda m: m.group(1) or m.group(2), text).split())


def as_sentence(text: str) -> str:
    """``text`` (a phrase or sentences) in plain text, capitalised and ending with a full stop."""
    text = plain(text).rstrip(":;, ")
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def first_sentence(text: str) -> str:
    """The first whole sentence of ``text`` in plain text: up to the first full stop that ends a
    sentence (not an abbreviation's, nor one inside brackets); all of it when none does."""
    text = plain(text)
    for m in re.finditer(r"[.!?](?=\s|$)", text):
        head = text[: m.end()]
        if head.endswith(_ABBREVIATIONS) or head.count("(") > head.count(")"):
            continue
        return as_sentence(head)
    return as_sentence(text)


def paragraphs(doc: str) -> list[str]:
    """A docstring's paragraphs, each one line of plain text."""
    return [plain(p) for p in re.split(r"\n\s*\n", doc or "") if p.strip()]


def command_help(usage: str, doc: str) -> str:
    """``usage`` then ``doc``'s paragraphs as plain wrapped text, leaving out a first paragraph
    that only repeats the command line (``python -m ...``)."""
    parts = paragraphs(doc)
    if parts and parts[0].startswith("python -m "):
        parts = parts[1:]
    wrapped = [textwrap.fill(p, WIDTH) for p in parts]
    return "\n\n".join([usage, *wrapped])


def experiment_summary(cls: type) -> str:
    """One sentence for ``--help``: the class's own ``SUMMARY``, else the first sentence of its own
    docstring or its module's, else the ``SUMMARY`` it inherits (a subclass is not its parent)."""
    if cls.__dict__.get("SUMMARY"):
        return as_sentence(cls.SUMMARY)
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclasses writes for an undocumented class
        doc = ""
    module = sys.modules.get(cls.__module__)
    text = doc or (module.__doc__ if module else "") or ""
    if text.strip():
        return first_sentence(text)
    return as_sentence(getattr(cls, "SUMMARY", "") or f"The {cls.__name__} experiment")


def class_defaults(cls: type) -> Any:
    """An instance of config class ``cls`` with its defaults. Its checks run when they pass; a
    critic-free experiment's defaults name no reward, which its checks refuse (a task or the user
    names one), so then the instance holds the defaults unchecked: enough to ask which option
    groups they read. None when a field has no default."""
    try:
        return cls()
    except (ValueError, TypeError):
        pass
    values = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
        else:
            return None
    instance = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(instance, name, value)
    return instance


def is_group(field: dataclasses.Field) -> bool:
    """A nested dataclass option group such as ``actor`` or ``ppo``."""
    return field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
        field.default_factory()
    )


def unread_groups(cls: type) -> set[str]:
    """The option groups of experiment config ``cls`` that its defaults never read (``critic`` of
    a critic-free experiment): ``unused_groups`` of ``class_defaults``."""
    defaults = class_defaults(cls)
    unused = getattr(defaults, "unused_groups", None)
    return set(unused()) if callable(unused) else set()


def option_groups(cls: type) -> list[str]:
    """The option groups experiment config ``cls`` has and reads, in field order."""
    unread = unread_groups(cls)
    return [f.name for f in dataclasses.fields(cls) if is_group(f) and f.name not in unread]


def task_experiments(task: Any) -> list[str]:
    """The registered experiments ``task`` has a recipe for."""
    runs = []
    for name in quickstart_experiments():
        try:
            task.recipe_experiment(name)
        except ValueError:
            continue
        runs.append(name)
    return runs


def _name_width() -> int:
    """The column the experiments' and tasks' descriptions start at: after the longest name."""
    return max(len(n) for n in [*quickstart_experiments(), *task_names()])


def _entry(name: str, text: str) -> str:
    return f"  {name:<{_name_width()}}  {text}"


def _more(text: str) -> str:
    return " " * (_name_width() + 4) + text


def experiments_section() -> list[str]:
    lines = ["experiments (python -m realrl.apps.quickstart <experiment> --help lists every option):"]
    for name in quickstart_experiments():
        cls = get_quickstart_exp(name)
        lines.append(_entry(name, experiment_summary(cls)))
        lines.append(_more(f"Option groups: {', '.join(option_groups(cls))}."))
    return lines


def tasks_section() -> list[str]:
    lines = [f"tasks (task=<name>, {DEFAULT_TASK} by default; what a run with no dataset path runs on):"]
    for name in task_names():
        task = get_task(name)
        lines.append(_entry(name, as_sentence(task.doc)))
        lines.append(_more(f"Experiments: {', '.join(task_experiments(task))}."))
    return lines


def presets_section() -> list[str]:
    return [
        "presets (ppo_preset=<name> sets the ppo.* options first; yours still win):",
        f"  {', '.join(PRESETS)}.",
    ]


def _value(value: Any) -> str:
    """A default as it is written on a hydra command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def dataclass_options(cls: type, prefix: str) -> list[str]:
    """One line per field of config dataclass ``cls``: ``prefix.name=default`` and its ``help``
    sentence (its field metadata)."""
    rows = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = _value(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _value(f.default_factory())
        else:
            default = "???"  # omegaconf's mark of a value that must be given
        rows.append((f"{prefix}.{f.name}={default}", as_sentence(f.metadata.get("help", ""))))
    width = max(len(key) for key, _ in rows)
    return [f"  {key:<{width}}  {text}".rstrip() for key, text in rows]
