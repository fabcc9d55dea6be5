"""name_resolve keys of one run, spelled in one place."""

from __future__ import annotations


def run_root(experiment_name: str, trial_name: str) -> str:
    return f"{experiment_name}/{trial_name}"


def master_stream(experiment_name: str, trial_name: str) -> str:
    return f"{run_root(experiment_name, trial_name)}/master_stream"


def dist_store(experiment_name: str, trial_name: str) -> str:
    return f"{run_root(experiment_name, trial_name)}/dist_store"


def worker_pid(experiment_name: str, trial_name: str, worker: str) -> str:
    return f"{run_root(experiment_name, trial_name)}/pid/{worker}"
