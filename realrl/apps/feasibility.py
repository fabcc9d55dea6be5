"""Whether an experiment can run here, checked before any worker starts: the one pre-run check
that every way of running calls (the command line for every phase before the first starts,
``run_experiment`` for any config, a saved one included, and the plan search before it profiles
a layout). ``check_feasible`` raises a ``ValueError`` naming the option at fault.

It composes, in order: the config's own checks (the graph, the placements, the options:
``ExperimentConfig.validate``), whether each layout can split its model (``layout_fit``), and
whether the memory plan fits the GPUs the workers run on. Whether the workers have GPUs enough
is known once the machines are: ``local_devices`` answers it for this machine (the command line
before the first phase starts, ``run_experiment`` in local mode), a Ray run once it joined its
cluster. ``oversubscription`` says when the local workers outnumber this machine's CPU cores: they
can still run, only slower, so the command line warns rather than refuses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from realrl.api.core import devices
from realrl.api.core.layout_fit import check_layouts
from realrl.api.core.model_size import model_config, model_configs
from realrl.api.core.system_api import ExperimentConfig
from realrl.api.quickstart.memory_plan import check_fits, plan_memory


def check_feasible(
    config: ExperimentConfig, device_bytes: int | None = None, fallback: Mapping[str, Any] | None = None
) -> None:
    """``config`` can run: it is consistent, every layout splits its model, and the memory plan
    puts no worker above ``device_bytes`` (None: the smallest GPU this process sees when the
    workers run on GPUs; CPU workers' memory is not checked). ``fallback``: the architecture of
    a model whose checkpoint a phase still to run writes (an embedded task's model config)."""
    config.validate()
    layouts, split = config.role_layouts(), _split_models(config, fallback)
    # a home in its engine's layout (whole experts per rank where asked); copies split experts
    check_layouts({r: ls[:1] for r, ls in layouts.items()}, split, _expert_parallel(config))
    check_layouts({r: ls[1:] for r, ls in layouts.items()}, split)
    _check_memory(config, device_bytes or _smallest_gpu_bytes(config), fallback)


def local_devices(config: ExperimentConfig, n_gpus: int | None = None) -> list[str]:
    """Each worker's device on this machine, once it has the GPUs they need: on CUDA one GPU per
    worker, unless the config colocates them (``colocate=true``: workers share GPUs round-robin;
    models that share workers in ``allocation_mode`` need no more workers, hence no more GPUs),
    and no layout that shards a model on shared GPUs. ``n_gpus``: the GPUs visible here (None:
    counted without importing torch, ``devices.visible_gpu_count``). A ``ValueError`` naming
    both counts otherwise."""
    if n_gpus is None:
        n_gpus = devices.visible_gpu_count() if devices.is_cuda(config.device) else 0
    placed = devices.local_devices(config.device, config.n_model_workers, n_gpus, config.colocate)
    devices.check_shared_gpus(placed, devices.dist_backend(placed), sharded_layouts(config))
    return placed


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def oversubscription(config: ExperimentConfig, cores: int | None = None) -> str | None:
    """One line saying that ``config``'s workers outnumber ``cores`` (None: ``cpu_cores()``), run
    on this machine: each is a process that computes, so they take turns on the cores and every
    step runs slower than on fewer workers. None when they fit."""
    cores = cpu_cores() if cores is None else cores
    n = config.n_model_workers
    if n <= cores:
        return None
    return (
        f"{n} model workers on {cores} CPU core(s): they take turns on the cores and every step runs "
        "slower; fewer workers (allocation_mode) or more cores run faster"
    )


def sharded_layouts(config: ExperimentConfig) -> list[str]:
    """Every layout in which a role's weights are sharded: tensor parallel, pipeline stages, or
    FSDP at its home (a copy in another call's layout is never FSDP)."""
    out = []
    for role, layouts in sorted(config.role_layouts().items()):
        fsdp = _engine_option(config, role, "fsdp")
        for i, lay in enumerate(layouts):
            if lay.tp > 1 or lay.pp > 1 or (i == 0 and fsdp and lay.dp > 1):
                out.append(f"{role} in {lay}")
    return out


def _engine_option(config: ExperimentConfig, role: str, name: str) -> bool:
    """A role's engine option (``fsdp``, ``expert_parallel``) as its config gives it."""
    engine = config.models[role].backend.args.get("engine") or {}
    return bool(engine.get(name, False) if isinstance(engine, dict) else getattr(engine, name, False))


def _expert_parallel(config: ExperimentConfig) -> dict[str, bool]:
    return {role: _engine_option(config, role, "expert_parallel") for role in config.allocations}


def _check_memory(
    config: ExperimentConfig, device_bytes: int | None, fallback: Mapping[str, Any] | None
) -> None:
    """ValueError when the memory plan puts a worker's peak above ``device_bytes`` (None: not
    checked; nor are runs with a plugin's model type, which the plan cannot count)."""
    kinds = {spec.model.type_ for spec in config.models.values()}
    if device_bytes is None or not kinds <= {"real_model", "null"}:
        return
    try:
        check_fits(plan_memory(config, model_configs(config, fallback)), device_bytes)
    except ValueError as e:
        raise ValueError(
            f"the memory plan does not fit: {e}; `python -m realrl.apps.plan <experiment> <the same "
            "options>` prints every role's bytes per device"
        ) from None


def _smallest_gpu_bytes(config: ExperimentConfig) -> int | None:
    """The memory of the smallest GPU this process sees when the workers run on GPUs (None on
    CPU workers, or when this process sees no GPU: a Ray driver off the GPU nodes)."""
    if not devices.is_cuda(config.device):
        return None  # and torch stays unimported: the command line's process needs none
    import torch

    if not torch.cuda.is_available():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def _split_models(config: ExperimentConfig, fallback: Mapping[str, Any] | None) -> dict:
    """The architecture of every ReaLModel role that tensor or pipeline parallelism splits in some
    layout (read from its config or its checkpoint's config.json, no weights)."""
    return {
        role: model_config(config.models[role], fallback)
        for role, layouts in config.role_layouts().items()
        if any(lay.tp > 1 or lay.pp > 1 for lay in layouts)
        and config.models[role].model.type_ == "real_model"
    }
