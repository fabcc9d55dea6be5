"""``python -m realrl.apps.plan <experiment> key=value ... [device_memory_gb=80] [n_devices=8]``.

Prints the per-device memory plan of a quickstart experiment (``realrl.api.quickstart.memory_plan``)
and says whether it fits. Runs nothing: model folders need only their ``config.json``, the dataset
file need not exist, and an embedded task (no dataset path) writes none of its files and plans its
model for checkpoints not trained yet. Exit status 2 with one ``error:`` line when an option is
wrong, the layouts need more than ``n_devices`` workers, or a worker is over ``device_memory_gb`` GiB.
"""

from __future__ import annotations

import os
import sys

from realrl.api.core.system_api import ModelSpec

# device_memory_gb is read in GiB (2^30 bytes): the unit of GPU memory sizes (an "80 GB" H100 has 80 GiB
# of HBM, ~79.6 GiB of it visible to CUDA); leave a margin for the CUDA context, NCCL and fragmentation
GiB = 1024**3


def _split_args(argv: list[str]) -> tuple[str, list[str], float, int | None]:
    """(experiment, overrides for build_config, device_memory_gb, n_devices)."""
    name, overrides, memory_gb, n_devices = argv[0], [], 80.0, None
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        try:
            if key == "device_memory_gb":
                memory_gb = float(value)
            elif key == "n_devices":
                n_devices = int(value)
            else:
                overrides.append(arg)
        except ValueError:
            raise ValueError(f"{key}={value!r} is not a number") from None
    if memory_gb <= 0 or (n_devices is not None and n_devices < 1):
        raise ValueError(f"device_memory_gb must be > 0 and n_devices >= 1, got {memory_gb} and {n_devices}")
    return name, overrides, memory_gb, n_devices


def _task_fallback(spec: ModelSpec, task_config: dict, fileroot: str) -> dict | None:
    """The task's model for a checkpoint under ``fileroot`` (not trained yet); None for other paths."""
    path = os.path.abspath(str(spec.model.args.get("path", "")))
    return task_config if path.startswith(os.path.abspath(fileroot) + os.sep) else None


def plan(argv: list[str]) -> str:
    """The printed plan; ValueError when it cannot be made or does not fit."""
    from realrl.api.core.model_size import model_config
    from realrl.api.quickstart.entrypoint import quickstart_experiments
    from realrl.api.quickstart.memory_plan import check_fits, format_plan, plan_memory
    from realrl.apps.configs import build_config, register_everything
    from realrl.experiments.tasks import get_task

    name, overrides, memory_gb, n_devices = _split_args(argv)
    register_everything()
    if name not in quickstart_experiments():
        raise ValueError(f"unknown experiment {name!r}; choose one of {quickstart_experiments()}")
    cfg = build_config(name, overrides)  # an embedded task's paths: its files need not exist
    exp = cfg.initial_setup()
    toy = cfg.task is not None
    task_config = get_task(cfg.task).model_config() if toy else {}
    configs = {
        role: model_config(spec, _task_fallback(spec, task_config, exp.fileroot) if toy else None)
        for role, spec in exp.models.items()
    }
    if n_devices is not None and exp.n_model_workers > n_devices:
        layouts = ", ".join(f"{m.name}:{exp.call_placement(m.name)}" for m in exp.mfcs)
        raise ValueError(
            f"the layouts ({layouts}) need {exp.n_model_workers} workers > n_devices={n_devices}"
        )
    memory = plan_memory(exp, configs)
    limit = int(memory_gb * GiB)
    head = f"{name}: {exp.n_model_workers} workers, {memory_gb:g} GiB per device"
    print(
        head + ("" if not toy else f" (task {cfg.task}: its checkpoints not trained yet count as its model)")
    )
    print(format_plan(memory, limit))
    check_fits(memory, limit)
    peak = max(w.peak for w in memory.workers)
    return f"fits: largest worker peak {peak / GiB:.2f} GiB <= {limit / GiB:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    from omegaconf.errors import OmegaConfBaseException

    from realrl.apps.errors import EXIT_USER_ERROR, one_line

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        from realrl.apps.help_text import command_help

        usage = "usage: python -m realrl.apps.plan <experiment> [key=value ...] [device_memory_gb=80] [n_devices=8]"
        print(command_help(usage, __doc__), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        print(plan(argv))
    except (ValueError, LookupError, OmegaConfBaseException) as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
