"""``key=value`` overrides, read by hydra's override parser, and the errors that name them.

hydra's grammar (``key=value``, ``+key=value`` to add a key to a dict option such as ``manual``,
``++key=value``, ``~key``, quoted strings, ``[lists]``, ``{dicts}``, ``${interpolations}``, and
``a,b`` for a sweep under ``--multirun``) with two courtesies: a ``=`` inside a value needs no
backslash (``prerequisite_overrides=[model.path=/x]``), and outside ``--multirun`` a value with
commas that is not a list (``allocation_mode=actor:d2,*:d1``) is the text itself, as hydra's own
message suggests (quoting it). omegaconf (through hydra's compose) checks keys and types, the
config dataclasses' ``__post_init__`` the values; either way the message names the key: a check
in a nested group (``actor.optimizer``) gets the group's key, an unknown key the closest known one.
``wants_traceback`` reads ``debug=true`` from the raw arguments, before any config exists.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Iterator
from typing import Any

from realrl.apps.errors import UserError, one_line

_TRUE = ("true", "yes", "on", "1")


def parse_override(override: str) -> Any:
    """``override`` as hydra reads it (a ``hydra.core.override_parser.types.Override``), or a
    ``UserError`` that names it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    key, sep, value = override.partition("=")
    if not sep and not override.startswith("~"):
        raise UserError(f"{override!r} is not key=value (e.g. seed=3; run with --help for the keys)")
    if sep and not key.lstrip("+~").strip():
        raise UserError(f"{override!r} has no key before '='")
    try:
        return parser.parse_overrides([override])[0]
    except OverrideParseException as e:
        problem = re.sub(r"^Error parsing override '.*' ", "", one_line(e.message).split(" See https://")[0])
    if "=" in value:  # the unescaped '=' of a value: hydra wants it as '\\='
        try:
            return parser.parse_overrides([key + "=" + value.replace("=", "\\=")])[0]
        except OverrideParseException:
            pass
    bare = key.lstrip("+~")
    if not re.fullmatch(r"[\w-]+(\.[\w-]+)*", bare):
        raise UserError(
            f"{override!r}: {bare!r} is not a key; keys are names joined by '.' (actor.optimizer.lr)"
        )
    raise UserError(
        f"{override}: cannot read the value ({problem}); quote text with special characters: '{bare}=\"...\"'"
    )


def parse_overrides(overrides: list[str], multirun: bool = False) -> list[Any]:
    """Every override parsed; outside ``multirun`` a plain ``a,b`` value is the text ``'a,b'``."""
    out = []
    for o in overrides:
        parsed = parse_override(o)
        if parsed.is_sweep_override() and not multirun:
            parsed = _as_text(parsed)
        out.append(parsed)
    return out


def _as_text(override: Any) -> Any:
    """A sweep outside ``--multirun``: the text as typed when it is a plain ``a,b`` list, the
    advice of hydra's own message otherwise."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Quote, QuotedString

    if override.is_choice_sweep() and override.value().simple_form:
        text = QuotedString(text=override.get_value_string().strip(), quote=Quote.single).with_quotes()
        return OverridesParser.create().parse_overrides([f"{override.get_key_element()}={text}"])[0]
    raise UserError(
        f"{override.input_line}: a sweep runs with --multirun; to give it as text, quote it: "
        f"'{override.key_or_group}=\"...\"'"
    )


def override_key(override: str) -> str:
    """The dotted key an override sets (``+manual.actor=[0]`` -> ``manual.actor``)."""
    return parse_override(override).key_or_group


def command_line_form(overrides: list[Any]) -> list[str]:
    """Parsed overrides as strings hydra's compose reads the same way (the escaped or quoted form
    when ``parse_override`` had to write one)."""
    return [o.input_line for o in overrides]


def to_object(node: Any, user: list[str]) -> Any:
    """The config dataclass of ``node``: interpolations resolved, ``__post_init__`` checks run."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        full_key = str(getattr(e, "full_key", "") or "")
        culprit = _matching_override(full_key, user) or _interpolating_override(str(e), user)
        raise UserError(
            omegaconf_message(str(e), full_key, OmegaConf.get_type(node), culprit or full_key)
        ) from e
    except (ValueError, TypeError, LookupError) as e:
        raise UserError(_located(node, e)) from e
    check_numbers(cfg)
    return cfg


def _matching_override(full_key: str, user: list[str]) -> str | None:
    """The user's override that set ``full_key`` or a key above or below it."""
    for o in reversed(user):
        key = override_key(o)
        if key == full_key or key.startswith(full_key + ".") or full_key.startswith(key + "."):
            return o
    return None


def _interpolating_override(message: str, user: list[str]) -> str | None:
    """The user's ``key=${...}`` override an interpolation error is about (another key that
    refers to it, such as the toy task's trial_name, may be the one omegaconf names)."""
    with_refs = [o for o in user if "${" in o.partition("=")[2]]
    named = [o for o in with_refs if any(f"'{ref}'" in message for ref in _refs(o))]
    return (named or with_refs or [None])[0]


def _refs(override: str) -> list[str]:
    return re.findall(r"\$\{([^}]*)\}", override.partition("=")[2])


def omegaconf_message(message: str, full_key: str, config_cls: type | None, where: str | None) -> str:
    """omegaconf's first line (of ``message``, about ``full_key``) led by ``where`` (the override
    at fault, else the key omegaconf names), and for an unknown key its closest match."""
    message = one_line(message)
    if "not in" in message or "is not in struct" in message:
        # omegaconf >= 2.4 suggests the field's short name itself; ours names the whole key
        message = re.sub(r"\.? ?Did you mean: .*$", "", message) + _suggestion(full_key, config_cls)
    where = where or full_key
    return f"{where}: {message}" if where else message


def _suggestion(full_key: str, config_cls: type | None) -> str:
    """'; did you mean ...?' or the keys of the group, for an unknown ``full_key``."""
    parent, _, name = full_key.rpartition(".")
    cls = config_cls
    for part in parent.split(".") if parent else []:
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        cls = _field_type(fields[part]) if part in fields else None
    if not dataclasses.is_dataclass(cls):
        return ""
    keys = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(name, keys, n=1)
    prefix = parent + "." if parent else ""
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    return f"; the keys of {parent or 'this experiment'} are: {', '.join(keys)}"


def _field_type(field: dataclasses.Field) -> type | None:
    """A nested group's dataclass (from its default factory: annotations may be strings)."""
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        return type(value) if dataclasses.is_dataclass(value) else None
    return None


def _located(node: Any, e: Exception) -> str:
    """A ``__post_init__`` error led by the key of the group that raised it (``actor.optimizer``):
    the deepest nested group whose own check raises the same message."""
    from omegaconf import OmegaConf

    message = one_line(str(e))
    path, current = "", node
    while True:
        for key, child in _groups(current):
            try:
                OmegaConf.to_object(child)
            except Exception as inner:  # noqa: BLE001 - only its message matters here
                if one_line(str(inner)) == message:
                    path, current = f"{path}.{key}" if path else str(key), child
                    break
        else:
            break
    return _name_group(message, path, OmegaConf.get_type(current))


def _groups(node: Any) -> Iterator[tuple[str, Any]]:
    """The nested option groups (dataclass nodes) right under ``node``."""
    from omegaconf import DictConfig, OmegaConf

    for key in node.keys():
        try:
            child = node[key]
        except Exception:  # noqa: BLE001 - a leaf that fails to resolve is no group
            continue
        if isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            yield str(key), child


def _name_group(message: str, path: str, cls: type | None) -> str:
    """'OptimizerConfig.lr must ...' -> 'actor.optimizer.lr must ...': the key the user types."""
    if not path or message.startswith(path + ".") or message.startswith(path + "="):
        return message
    name = getattr(cls, "__name__", "")
    for sep in (".", ": "):
        if name and message.startswith(name + sep):
            message = message[len(name) + len(sep) :]
            break
    first = re.match(r"[A-Za-z_]\w*", message)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if first and first.group() in fields:
        return f"{path}.{message}"
    return f"{path}: {message}"


def check_numbers(cfg: Any, prefix: str = "") -> None:
    """No option is NaN (omegaconf takes 'nan' for a float, and every check compares false)."""
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_numbers(value, key + ".")
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, float) and math.isnan(v) for v in values):
            raise UserError(f"{key}={value}: not a number; give a finite value")


def wants_traceback(argv: list[str]) -> bool:
    """``debug=true`` among the arguments (read by hydra's parser before any config exists) or
    HYDRA_FULL_ERROR=1."""
    if os.environ.get("HYDRA_FULL_ERROR", "").strip().lower() in _TRUE:
        return True
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue  # a flag or the experiment
        try:
            override = parse_override(arg)
        except UserError:
            continue  # reported once the config is built
        if override.key_or_group == "debug" and str(override.value()).strip().lower() in _TRUE:
            return True
    return False
