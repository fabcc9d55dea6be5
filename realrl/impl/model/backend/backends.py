"""The registered backends: what a model worker builds from ``ModelBackendAbstraction``.

``make_backend(ModelBackendAbstraction(name, args)).initialize(model, ft_spec)`` replaces
``model.module`` by an engine and returns the model:
  "train"      TrainEngine(optimizer=OptimizerConfig | dict, engine=EngineConfig | dict, dp_group=None)
  "inference"  InferenceEngine(engine=EngineConfig | dict)
  "null"       leaves the model as it is
``dp_group`` is a torch.distributed process group of the model's data-parallel ranks (the model
worker passes it at run time); None trains in one process. Every backend accepts it; only "train"
uses it.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from realrl.api.core.model_api import FinetuneSpec, Model, register_backend
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig, coerce
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine


def _check_module(model: Model, backend: str) -> None:
    if isinstance(model.module, InferenceEngine):
        raise ValueError(
            f"backend {backend!r}: model {model.name} is already wrapped by {type(model.module).__name__}"
        )


class TrainBackend:
    def __init__(
        self,
        optimizer: OptimizerConfig | dict[str, Any] | None = None,
        engine: EngineConfig | dict[str, Any] | None = None,
        dp_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.optimizer = coerce(OptimizerConfig, optimizer, "train backend 'optimizer'")
        self.engine = coerce(EngineConfig, engine, "train backend 'engine'")
        self.dp_group = dp_group

    def initialize(self, model: Model, ft_spec: FinetuneSpec) -> Model:
        _check_module(model, "train")
        model.module = TrainEngine(
            model.module,
            self.optimizer,
            self.engine,
            total_train_steps=ft_spec.total_train_steps,
            device=model.device,
            dp_group=self.dp_group,
        )
        model.ft_spec = ft_spec
        return model


class InferenceBackend:
    def __init__(
        self, engine: EngineConfig | dict[str, Any] | None = None, dp_group: dist.ProcessGroup | None = None
    ) -> None:
        del dp_group  # accepted so every backend takes the same arguments; inference needs no sync
        self.engine = coerce(EngineConfig, engine, "inference backend 'engine'")

    def initialize(self, model: Model, ft_spec: FinetuneSpec | None = None) -> Model:
        _check_module(model, "inference")
        model.module = InferenceEngine(model.module, self.engine, device=model.device)
        model.dtype = model.module.dtype
        return model


class NullBackend:
    def __init__(self, dp_group: dist.ProcessGroup | None = None) -> None:
        del dp_group

    def initialize(self, model: Model, ft_spec: FinetuneSpec | None = None) -> Model:
        return model


register_backend("train", TrainBackend)
register_backend("inference", InferenceBackend)
register_backend("null", NullBackend)
