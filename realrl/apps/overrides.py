"""``key=value`` overrides -> an experiment's config, every error naming the override at fault.

Values are read as YAML (``[0,1]``, ``{target: 8}``, ``"a,b"``, ``null``), as omegaconf's
``from_dotlist`` reads them; hydra's ``+key=value`` (add a key to a dict option such as
``manual``) and ``++key=value`` are taken too. omegaconf checks keys and types, the config
dataclasses' ``__post_init__`` the values; either way the message names the key: a check in a
nested group (``actor.optimizer``) gets the group's key, an unknown key the closest known one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterator
from typing import Any

from realrl.apps.errors import UserError, one_line

_KEY = re.compile(r"[\w-]+(\.[\w-]+)*")  # what omegaconf takes as a plain dotted key


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _strip_add(override: str) -> str:
    """hydra's ``+key=v`` / ``++key=v``: the dotlist merge adds dict keys by itself."""
    return override.lstrip("+") if override.startswith("+") else override


def check_syntax(overrides: list[str]) -> None:
    """Every override is ``key=value`` with a key (``~key`` deletion is not supported)."""
    for o in overrides:
        if o.startswith("~"):
            raise UserError(f"{o!r}: removing an option is not supported; set it to a value or null")
        if "=" not in o:
            raise UserError(f"{o!r} is not key=value (e.g. seed=3; run with --help for the keys)")
        key = override_key(o)
        if not key.strip():
            raise UserError(f"{o!r} has no key before '='")
        if not _KEY.fullmatch(key):
            raise UserError(f"{o!r}: {key!r} is not a key; keys are names joined by '.' (actor.optimizer.lr)")


def parse_values(overrides: list[str]) -> Any:
    """The overrides as one omegaconf node (values parsed as YAML), or the override that fails."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    check_syntax(overrides)
    values = OmegaConf.create({})
    for o in overrides:
        try:
            values.merge_with_dotlist([_strip_add(o)])
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or one_line(str(e))
            raise UserError(
                f"{o}: cannot read the value ({problem}); quote text with special characters: "
                f"'{override_key(o)}=\"...\"'"
            ) from e
        except OmegaConfBaseException as e:
            raise UserError(f"{o}: {one_line(str(e))}") from e
    return values


def merge(config_cls: type, dotlist: list[str], user: list[str]) -> Any:
    """The structured config of ``config_cls`` with ``dotlist`` merged in (not yet resolved)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    values = parse_values(dotlist)
    try:
        return OmegaConf.merge(OmegaConf.structured(config_cls), values)
    except OmegaConfBaseException as e:
        full_key = str(getattr(e, "full_key", "") or "")
        culprit = _matching_override(full_key, user) if full_key else _failing_override(config_cls, user)
        raise UserError(_omegaconf_message(e, config_cls, culprit)) from e


def _failing_override(config_cls: type, user: list[str]) -> str | None:
    """The first of the user's overrides that cannot be merged alone (omegaconf did not say)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for o in user:
        try:
            OmegaConf.merge(OmegaConf.structured(config_cls), parse_values([o]))
        except OmegaConfBaseException:
            return o
    return None


def to_object(node: Any, user: list[str]) -> Any:
    """The config dataclass of ``node``: interpolations resolved, ``__post_init__`` checks run."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        full_key = str(getattr(e, "full_key", "") or "")
        culprit = _matching_override(full_key, user) or _interpolating_override(str(e), user)
        raise UserError(_omegaconf_message(e, OmegaConf.get_type(node), culprit or full_key)) from e
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


def _omegaconf_message(e: Exception, config_cls: type | None, where: str | None) -> str:
    """omegaconf's first line led by ``where`` (the override at fault, else the key omegaconf
    names), and for an unknown key its closest match."""
    full_key = str(getattr(e, "full_key", "") or "")
    message = one_line(str(e))
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
