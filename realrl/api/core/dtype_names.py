"""Tensor dtypes by name ("float32", "int64", "bool", ...), so metadata never needs torch.

The master holds every sample's metadata and must not import torch (it only moves metadata:
docs/runtime.md), so a ``SequenceSample``'s and a ``KeySpec``'s dtypes are these names, the
spelling ``str(torch.float32)`` gives without its ``torch.`` prefix. Workers turn a name back into
a ``torch.dtype`` with ``to_torch``.
"""

from __future__ import annotations

from typing import Any

DTYPE_NAMES = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "float8_e4m3fn",
        "float8_e5m2",
    }
)


def dtype_name(dtype: Any) -> str:
    """The name of ``dtype``: a name as it is, a ``torch.dtype`` as its name (``torch.long`` ->
    ``"int64"``). Unknown names are refused, naming the known ones."""
    name = dtype if isinstance(dtype, str) else str(dtype)
    name = name.removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown tensor dtype {dtype!r}; known: {sorted(DTYPE_NAMES)}")
    return name


def to_torch(name: str) -> Any:
    """The ``torch.dtype`` called ``name``. Only workers call this: they have imported torch,
    so the import below costs nothing there, and the master, which never calls it, never pays it."""
    import torch

    return getattr(torch, dtype_name(name))
