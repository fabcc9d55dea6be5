"""The registered backends: what a model worker builds from ``ModelBackendAbstraction``.

``make_backend(ModelBackendAbstraction(name, args)).initialize(model, ft_spec)`` replaces
``model.module`` by an engine and returns the model:
  "train"      TrainEngine(optimizer=OptimizerConfig | dict, engine=EngineConfig | dict)
  "inference"  InferenceEngine(engine=EngineConfig | dict, offload=False)
  "null"       leaves the model as it is
The constructor contract: every registered backend takes a keyword-only ``parallel`` (default
None): the model's ``ParallelContext`` on this worker (its layout, device mesh and process groups,
the data-parallel group among them), which the model worker always passes, once, at run time;
None is a model on one worker. A backend with nothing to synchronise still names it (and may
reject a layout it cannot serve), so no caller has to guess from a ``TypeError`` what a backend
accepts. The train and inference backends split the module as the layout says (tensor
parallelism, with whole experts per rank when ``engine.expert_parallel``, then FSDP2 when
``engine.fsdp``; a bf16/fp16 train engine's units gathered in that dtype over fp32 shards) before
wrapping it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from realrl.api.core.model_api import FinetuneSpec, Model, register_backend
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig, coerce
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine
from realrl.impl.model.parallel.apply import parallelize
from realrl.impl.model.parallel.mesh import ParallelContext


def _check_module(model: Model, backend: str) -> None:
    if isinstance(model.module, InferenceEngine):
        raise ValueError(
            f"backend {backend!r}: model {model.name} is already wrapped by {type(model.module).__name__}"
        )


def fsdp_param_dtype(engine: EngineConfig, device: torch.device | str, trains: bool) -> torch.dtype | None:
    """The dtype FSDP2 gathers a unit's weights and computes in, when not the module's own: a
    train engine's bf16 or fp16 (its shards stay fp32 master weights, its gradients reduce in
    fp32). An inference engine casts its module instead; an fp32 engine needs no policy."""
    dtype = engine.resolve_dtype(device)
    return dtype if trains and engine.fsdp and dtype != torch.float32 else None


def _split(
    model: Model, engine: EngineConfig, parallel: ParallelContext | None, trains: bool
) -> ParallelContext | None:
    """Make ``model.module`` parallel as its layout says; the context the engine is given."""
    if parallel is None:
        return None
    parallel = dataclasses.replace(parallel, fsdp=engine.fsdp, expert_parallel=engine.expert_parallel)
    parallelize(model.module, parallel, fsdp_param_dtype(engine, model.device, trains))
    return parallel


class TrainBackend:
    def __init__(
        self,
        optimizer: OptimizerConfig | dict[str, Any] | None = None,
        engine: EngineConfig | dict[str, Any] | None = None,
        *,
        parallel: ParallelContext | None = None,
    ) -> None:
        self.optimizer = coerce(OptimizerConfig, optimizer, "train backend 'optimizer'")
        self.engine = coerce(EngineConfig, engine, "train backend 'engine'")
        self.parallel = parallel

    def initialize(self, model: Model, ft_spec: FinetuneSpec) -> Model:
        _check_module(model, "train")
        parallel = _split(model, self.engine, self.parallel, trains=True)
        model.module = TrainEngine(
            model.module,
            self.optimizer,
            self.engine,
            total_train_steps=ft_spec.total_train_steps,
            device=model.device,
            parallel=parallel,
        )
        model.ft_spec = ft_spec
        return model


class InferenceBackend:
    def __init__(
        self,
        engine: EngineConfig | dict[str, Any] | None = None,
        offload: bool = False,
        *,
        parallel: ParallelContext | None = None,
    ) -> None:
        self.engine = coerce(EngineConfig, engine, "inference backend 'engine'")
        self.offload = offload
        self.parallel = parallel

    def initialize(self, model: Model, ft_spec: FinetuneSpec | None = None) -> Model:
        _check_module(model, "inference")
        parallel = _split(model, self.engine, self.parallel, trains=False)
        model.module = InferenceEngine(
            model.module, self.engine, device=model.device, parallel=parallel, offload=self.offload
        )
        model.dtype = model.module.dtype
        return model


class NullBackend:
    def __init__(self, *, parallel: ParallelContext | None = None) -> None:
        if parallel is not None and parallel.layout.tp > 1:
            raise ValueError(
                f"backend 'null' cannot split a model over tensor-parallel ranks (layout {parallel.layout})"
            )

    def initialize(self, model: Model, ft_spec: FinetuneSpec | None = None) -> Model:
        return model


register_backend("train", TrainBackend)
register_backend("inference", InferenceBackend)
register_backend("null", NullBackend)
