"""One error type for bad dataset input, always naming the file, the line or row and the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_TOKEN_ID = 2**63  # token ids are int64 tensors: a larger JSON integer is no id


class DataError(ValueError):
    """Bad input data; the message says where (file, line or row) and what (field)."""


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object"}


def _describe(types: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def get_field(row: Mapping[str, Any], name: str, types: type | tuple[type, ...], where: str) -> Any:
    """``row[name]``, checked to be of ``types``; a missing or mistyped field is a ``DataError``."""
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected an object with field {name!r}, got {type(row).__name__}")
    if name not in row or row[name] is None:
        raise DataError(f"{where}: missing field {name!r} (fields present: {sorted(row)})")
    value = row[name]
    # bool is an int subclass, but a JSON true/false is never a valid id, length or margin
    is_bool = isinstance(value, bool) and bool not in types and object not in types
    if is_bool or not isinstance(value, types):
        if not (float in types and isinstance(value, int) and not isinstance(value, bool)):
            raise DataError(
                f"{where}: field {name!r} must be {_describe(types)}, got {type(value).__name__} {value!r:.60}"
            )
    return value


def check_token_ids(value: Any, name: str, where: str) -> list[int]:
    """A pre-tokenized field: a non-empty list of non-negative ints."""
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where}: field {name!r} must be a non-empty list of token ids, got {value!r:.60}")
    for j, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < MAX_TOKEN_ID:
            raise DataError(
                f"{where}: field {name!r}[{j}] must be a non-negative integer token id, got {x!r:.60}"
            )
    return [int(x) for x in value]
