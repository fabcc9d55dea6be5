"""name_resolve keys of one run, spelled in one place, and the repository that holds them."""

from __future__ import annotations

from realrl.api.core.system_api import NameResolveConfig
from realrl.base.name_resolve import NameRecordRepository, make_repository


def make_name_record(cfg: NameResolveConfig) -> NameRecordRepository:
    """The run's name_resolve repository: files, memory or (``kind="ray"``) Ray's internal store."""
    if cfg.kind == "ray":
        from realrl.base.name_resolve_ray import RayNameRecordRepository

        return RayNameRecordRepository(cfg.namespace)
    return make_repository(cfg.kind, root=cfg.root)


def run_root(experiment_name: str, trial_name: str) -> str:
    return f"{experiment_name}/{trial_name}"


def master_stream(experiment_name: str, trial_name: str) -> str:
    return f"{run_root(experiment_name, trial_name)}/master_stream"


def dist_store(experiment_name: str, trial_name: str) -> str:
    return f"{run_root(experiment_name, trial_name)}/dist_store"


def worker_pid(experiment_name: str, trial_name: str, worker: str) -> str:
    return f"{run_root(experiment_name, trial_name)}/pid/{worker}"
