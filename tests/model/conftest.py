"""Fixtures: a tiny random HF checkpoint of each family saved to a temporary folder."""

from __future__ import annotations

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
