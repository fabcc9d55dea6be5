"""Every registered backend's constructor names ``parallel``: the model worker passes it once."""

from __future__ import annotations

import inspect

import pytest

import realrl.impl.builtin  # noqa: F401  (registers the backends)
from realrl.api.core.config import ModelBackendAbstraction
from realrl.api.core.model_api import _BACKENDS, make_backend, registered_backends


@pytest.mark.parametrize("name", ["train", "inference", "null"])
def test_registered_backend_takes_parallel_by_keyword(name):
    params = inspect.signature(_BACKENDS.get(name)).parameters
    assert params["parallel"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["parallel"].default is None
    backend = make_backend(ModelBackendAbstraction(name, {"parallel": None}))
    assert hasattr(backend, "initialize")


def test_every_registered_backend_accepts_parallel():
    for name in registered_backends():
        params = inspect.signature(_BACKENDS.get(name)).parameters
        assert "parallel" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        ), f"backend {name!r} does not take parallel"
