"""Sliding-window reading for the families whose configs list per-layer attention types."""

from __future__ import annotations

from typing import Any


def uniform_sliding_window(hf: Any, family: str) -> int | None:
    """The window if every layer slides, None if none does; mixed layouts are not supported.

    Without ``layer_types`` (a config.json written before transformers listed them) the layers
    from ``max_window_layers`` on slide when ``use_sliding_window`` is on, as transformers reads it."""
    window = getattr(hf, "sliding_window", None) if getattr(hf, "use_sliding_window", True) else None
    types = getattr(hf, "layer_types", None)
    if types is None:
        first = getattr(hf, "max_window_layers", 0) or 0
        types = [
            "sliding_attention" if window and i >= first else "full_attention"
            for i in range(hf.num_hidden_layers)
        ]
    return uniform_window(window, types, family)


def uniform_window(window: int | None, types: list[str], family: str) -> int | None:
    """``window`` if every layer type is "sliding_attention", None if none is (or no window)."""
    sliding = [t == "sliding_attention" for t in types]
    if not any(sliding) or not window:
        return None
    if all(sliding):
        return window
    raise ValueError(
        f"{family}: a mix of sliding and full attention layers (layer_types={types}) is not supported"
    )
