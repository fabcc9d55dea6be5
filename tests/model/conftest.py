"""Fixtures: a tiny random HF checkpoint of each family saved to a temporary folder, and the
released SmolLM2-135M-Instruct as an HF folder (for the ``slow`` tests of a real checkpoint)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from model_fixtures import FAMILIES, make_hf_model


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture
def hf_checkpoint(family, tmp_path):
    """(kind, HF model, folder it is saved in)."""
    model = make_hf_model(family)
    path = tmp_path / f"hf_{family}"
    model.save_pretrained(path)
    return family, model, str(path)


@pytest.fixture(scope="session")
def smollm2_folder(request, tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct's HF folder: $REALRL_SMOLLM2_DIR when set, else made once by
    ``examples/real_model/make_hf_folder.py`` into pytest's cache (or a temporary folder when the
    cache is off) and reused. Tests that take it are marked ``NEEDS_SMOLLM2``."""
    given = os.environ.get("REALRL_SMOLLM2_DIR")
    if given:
        return given
    cache = getattr(request.config, "cache", None)
    base = cache.mkdir("realrl-smollm2") if cache is not None else tmp_path_factory.mktemp("smollm2")
    out = os.path.join(str(base), "smollm2-135m-instruct")
    path = Path(__file__).resolve().parents[2] / "examples" / "real_model" / "make_hf_folder.py"
    spec = importlib.util.spec_from_file_location("make_hf_folder", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--out", out]) == 0
    return out
