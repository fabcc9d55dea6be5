"""The registered backends build engines around a Model's module."""

from __future__ import annotations

import pytest
import torch
from _backend_toy import PackedToyLM, make_batch, n_loss_tokens, token_loss

import realrl.impl.builtin  # noqa: F401  (registers the backends)
from realrl.api.core.config import ModelBackendAbstraction
from realrl.api.core.model_api import FinetuneSpec, Model, make_backend, registered_backends
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine

FT = FinetuneSpec(total_train_epochs=2, dataset_size=10, train_batch_size=4)  # 3 steps/epoch


def model() -> Model:
    torch.manual_seed(0)
    return Model("actor", PackedToyLM(pdrop=0.2), tokenizer=None)


def test_registered_names():
    assert {"train", "inference", "null"} <= set(registered_backends())


def test_train_backend_builds_engine_with_schedule_from_ft_spec():
    args = {
        "optimizer": {"lr": 1.0, "lr_scheduler_type": "linear", "min_lr_ratio": 0.0},
        "engine": {"disable_dropout": True},
    }
    m = make_backend(ModelBackendAbstraction("train", args)).initialize(model(), FT)
    assert isinstance(m.module, TrainEngine) and m.ft_spec is FT
    assert m.module.lr_scheduler.total_steps == 6
    assert all(d.p == 0.0 for d in m.module.module.modules() if isinstance(d, torch.nn.Dropout))
    stats = m.module.train_batch(make_batch([4, 6]), None, token_loss, n_loss_tokens, version_steps=3)
    assert stats["lr"] == pytest.approx(0.5)


def test_inference_backend_and_null():
    m = make_backend(ModelBackendAbstraction("inference", {"engine": {"dtype": "bf16"}})).initialize(
        model(), FT
    )
    assert isinstance(m.module, InferenceEngine) and not isinstance(m.module, TrainEngine)
    assert m.dtype == torch.bfloat16
    raw = model()
    module = raw.module
    assert make_backend("null").initialize(raw, FT).module is module


def test_bad_backend_args_are_named():
    with pytest.raises(ValueError, match="unknown OptimizerConfig fields \\['learning_rate'\\]"):
        make_backend(ModelBackendAbstraction("train", {"optimizer": {"learning_rate": 1.0}}))
    m = make_backend("inference").initialize(model(), FT)
    with pytest.raises(ValueError, match="already wrapped"):
        make_backend("train").initialize(m, FT)
