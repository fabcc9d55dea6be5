"""The copies of models a worker holds for calls placed outside their model's home.

A copy is an inference-only model (no optimizer, never FSDP) in the call's layout: built empty
on first use, filled from the home ranks by a planned reallocation
(``realrl.impl.model.comm``), freed after its call unless its role keeps it
(``<role>.keep_gen_copy``). The home model, and with it the optimizer state, is never touched.

Under asynchronous RL a kept copy on workers of its own then takes each new version as a weight
push (``send_weights`` on the home ranks, ``receive_weights`` on the copy's), over the same group
as its first fill, on the GPU under NCCL and through host memory under gloo.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

import torch.distributed as dist

from realrl.api.core import data_api, model_api
from realrl.api.core.lora import lora_of
from realrl.api.core.model_size import model_config
from realrl.api.core.system_api import ModelShardSpec, copy_name
from realrl.impl.model.backend.config import EngineConfig, coerce
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.comm.realloc import (
    build_copy,
    model_param_specs,
    post_sends,
    reallocate,
    receive,
    side_for,
)
from realrl.impl.model.comm.realloc_plan import ReallocPlan, plan_realloc
from realrl.impl.model.parallel.mesh import ParallelContext
from realrl.system.protocol import ReallocOrder


def _engine_config(spec: Any) -> EngineConfig:
    return coerce(EngineConfig, spec.backend.args.get("engine"), "backend 'engine'")


class ModelCopies:
    def __init__(
        self,
        me: int,
        device: str,
        specs: list[ModelShardSpec],
        parallel: dict[str, ParallelContext],
        groups: dict[tuple[int, ...], dist.ProcessGroup],
        timeout: datetime.timedelta,
    ):
        self.me, self.device, self.parallel, self.timeout = me, device, parallel, timeout
        self.groups = groups  # per reallocation this worker takes part in: its workers, its messages
        self.specs = {s.role: s.spec for s in specs}
        self.live: dict[str, model_api.Model] = {}
        self.plans: dict[tuple[str, bool], ReallocPlan] = {}
        # the groups whose communicator a reallocation created (every member there at once): the
        # only ones a push, whose halves run apart, may use
        self.connected: set[tuple[int, ...]] = set()

    def __getitem__(self, name: str) -> model_api.Model:
        return self.live[name]

    def drop(self, name: str) -> None:
        self.live.pop(name, None)

    def reallocate(
        self, order: ReallocOrder, home: model_api.Model | None, tokenizer: Any
    ) -> dict[str, float]:
        """Take part in ``order``: send what this worker's home rank holds (``home``: None when it
        holds none), receive what its copy lacks. Returns bytes sent and received, seconds waiting
        for the other workers of the order (busy with earlier calls) and seconds moving."""
        name = copy_name(order.role, order.dst)
        dst = None
        if self.me in order.dst.workers:
            if name not in self.live:
                self.live[name] = self._build(order.role, name, tokenizer)
            dst = self.live[name].module.module
        src = None if home is None else home.module.module
        plan = self._plan(order, name, self.specs[order.role])
        group = self.groups[tuple(order.workers)]  # the order's workers only: the others are busy
        tik = time.monotonic()
        dist.barrier(group=group)
        waited = time.monotonic() - tik
        stats = reallocate(
            plan, self.me, src, dst, self.timeout.total_seconds(), order.first_tag, group=group
        )
        self.connected.add(tuple(order.workers))
        if name in self.live:  # the version it now holds: what its generate calls stamp their samples with
            self.live[name].version.global_step = order.version
        return {
            "bytes_sent": stats.bytes_sent,
            "bytes_received": stats.bytes_received,
            "seconds": stats.seconds,
            "wait_seconds": waited,
        }

    def send_weights(
        self, order: ReallocOrder, home: model_api.Model
    ) -> tuple[list[tuple[Any, Any, int]], dict[str, float]]:
        """The send half of a weight push (asynchronous RL): post this home rank's messages to the
        copy ``order`` names. (work, buffer, peer) for each, not waited for, and the bytes sent
        with the seconds this worker was blocked packing and posting them."""
        tik = time.perf_counter()
        group = self._push_group(order)
        plan = self._plan(order, copy_name(order.role, order.dst), self.specs[order.role])
        sends = post_sends(plan, self.me, home.module.module, order.first_tag, group=group)
        blocked = time.perf_counter() - tik
        return sends, {"bytes_sent": sum(buf.numel() for _, buf, _ in sends), "send_blocked_s": blocked}

    def receive_weights(self, order: ReallocOrder, tokenizer: Any) -> dict[str, float]:
        """The receive half of a weight push: the copy (built on its first fill) takes the version
        ``order`` carries. Bytes received and seconds, as ``reallocate`` reports them, and the
        seconds this worker was blocked receiving and scattering them (``recv_blocked_s``)."""
        tik = time.perf_counter()
        group = self._push_group(order)
        name = copy_name(order.role, order.dst)
        if name not in self.live:
            self.live[name] = self._build(order.role, name, tokenizer)
        plan = self._plan(order, name, self.specs[order.role])
        stats = receive(
            plan,
            self.me,
            self.live[name].module.module,
            self.timeout.total_seconds(),
            order.first_tag,
            group=group,
        )
        self.live[name].version.global_step = order.version
        return {
            "bytes_sent": 0,
            "bytes_received": stats.bytes_received,
            "seconds": stats.seconds,
            "wait_seconds": 0.0,
            "recv_blocked_s": time.perf_counter() - tik,
        }

    def _push_group(self, order: ReallocOrder) -> dist.ProcessGroup:
        """The group of ``order``'s workers, once a reallocation has used it: a push posts its
        half without the others there, which must never be its communicator's first use (NCCL
        creates a communicator collectively, with every member present)."""
        workers = tuple(order.workers)
        if workers not in self.connected:
            raise RuntimeError(
                f"weight push of {order.role!r} (version {order.version}) to {order.dst} on worker "
                f"{self.me}: no reallocation has used the group of workers {list(workers)} yet, so "
                "its communicator does not exist; the copy's first fill must be a reallocation"
            )
        return self.groups[workers]

    def _plan(self, order: ReallocOrder, name: str, spec: Any) -> ReallocPlan:
        """The same plan on every worker of the order: a pure function of the two placements, the
        architecture and whether the copy holds the base already (cached: a copy is refilled in
        the same layouts every step)."""
        key = (name, order.adapters_only)
        if key not in self.plans:
            cfg, engine, lora = model_config(spec), _engine_config(spec), lora_of(spec.model.args)
            wire = engine.resolve_dtype(self.device)  # the copy's dtype: slices are cast before sending
            self.plans[key] = plan_realloc(
                model_param_specs(cfg, wire, lora, trained_only=order.adapters_only),
                # home as its engine lays it out (FSDP, whole experts per rank); a copy is never
                # FSDP and splits its experts by tensor parallelism
                side_for(cfg, order.src, engine.fsdp, lora, engine.expert_parallel),
                side_for(cfg, order.dst, lora=lora),
            )
        return self.plans[key]

    def _build(self, role: str, name: str, tokenizer: Any) -> model_api.Model:
        spec = self.specs[role]
        engine = dataclasses.replace(_engine_config(spec), fsdp=False)
        parallel = self.parallel[name]
        parallel = parallel if parallel.mesh is not None else None
        dtype = engine.resolve_dtype(self.device)
        module = build_copy(
            model_config(spec),
            parallel,
            self.device,
            dtype,
            spec.model.args.get("attn_impl", "auto"),
            lora_of(spec.model.args),
        )
        wrapped = InferenceEngine(module, engine, device=self.device, parallel=parallel)
        if tokenizer is None and spec.model.args.get("path"):
            tokenizer = data_api.load_hf_tokenizer(
                spec.model.args.get("tokenizer_path") or spec.model.args["path"]
            )
        return model_api.Model(
            model_api.ModelName(role), wrapped, tokenizer, device=self.device, dtype=wrapped.dtype
        )
