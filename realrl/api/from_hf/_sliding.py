"""Sliding-window reading for the families whose configs list per-layer attention types."""

from __future__ import annotations

from typing import Any


def uniform_sliding_window(hf: Any, family: str) -> int | None:
    """The window if every layer slides, None if none does; mixed layouts are not supported."""
    window = getattr(hf, "sliding_window", None)
    types = getattr(hf, "layer_types", None)
    if types is None:
        use = getattr(hf, "use_sliding_window", True)
        return window if (use and window) else None
    sliding = [t == "sliding_attention" for t in types]
    if not any(sliding) or not window:
        return None
    if all(sliding):
        return window
    raise ValueError(
        f"{family}: a mix of sliding and full attention layers (layer_types={types}) is not supported"
    )
