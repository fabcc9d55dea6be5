"""Logger factory for realrl.

Every logger lives under the ``realrl`` namespace and the handler is attached to that
namespace only, so importing realrl never changes how the user's root logger behaves.
"""

from __future__ import annotations

import logging
import sys

ROOT_NAME = "realrl"
_FORMAT = "%(asctime)s.%(msecs)03d %(name)s %(levelname)s: %(message)s"
_DATE_FORMAT = "%Y%m%d-%H:%M:%S"


def _ensure_namespace_handler() -> logging.Logger:
    root = logging.getLogger(ROOT_NAME)
    if not any(getattr(h, "_realrl_handler", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
        handler._realrl_handler = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
    return root


def getLogger(name: str, level: int | str | None = None) -> logging.Logger:  # noqa: N802
    """Return ``realrl.<name>``, configured once, leaving the root logger untouched."""
    _ensure_namespace_handler()
    full = name if name.startswith(ROOT_NAME + ".") or name == ROOT_NAME else f"{ROOT_NAME}.{name}"
    logger = logging.getLogger(full)
    if level is not None:
        logger.setLevel(level)
    return logger


def add_file_handler(path: str, level: int = logging.INFO) -> logging.Handler:
    """Mirror every realrl log line into ``path`` (a worker's log under the run folder)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    handler.setLevel(level)
    _ensure_namespace_handler().addHandler(handler)
    return handler
