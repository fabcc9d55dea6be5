"""``python -m realrl.apps.plan <experiment> key=value ... [device_memory_gb=80] [n_devices=8]``.

Prints the per-device memory plan of a quickstart experiment (``realrl.api.quickstart.memory_plan``)
and says whether it fits. Runs nothing: model folders need only their ``config.json``, the dataset
file need not exist, and the toy default (no dataset path) writes no toy files and plans the toy
model for checkpoints not trained yet. Exit status 2 with one ``error:`` line when an option is
wrong, the layouts need more than ``n_devices`` workers, or a worker is over ``device_memory_gb`` GiB.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

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


@contextlib.contextmanager
def _no_toy_files() -> Iterator[None]:
    """The toy task's paths without writing its corpus (``ToyLayout.build`` writes ~6 MB)."""
    from realrl.experiments import toy

    build = toy.ToyLayout.build
    toy.ToyLayout.build = lambda self, *a, **k: toy.toy_paths(self.data_dir)
    try:
        yield
    finally:
        toy.ToyLayout.build = build


def _toy_fallback(spec: ModelSpec, fileroot: str) -> dict | None:
    """The toy model for a toy checkpoint under ``fileroot`` (not trained yet); None for other paths."""
    from realrl.impl.dataset.toy.corpus import toy_model_config

    path = os.path.abspath(str(spec.model.args.get("path", "")))
    return toy_model_config() if path.startswith(os.path.abspath(fileroot) + os.sep) else None


def plan(argv: list[str]) -> str:
    """The printed plan; ValueError when it cannot be made or does not fit."""
    from realrl.api.quickstart.entrypoint import quickstart_experiments
    from realrl.api.quickstart.memory_plan import check_fits, format_plan, model_config, plan_memory
    from realrl.apps.overrides import override_key
    from realrl.apps.quickstart import DATA_PATH_KEYS, _register_everything, build_config

    name, overrides, memory_gb, n_devices = _split_args(argv)
    _register_everything()
    if name not in quickstart_experiments():
        raise ValueError(f"unknown experiment {name!r}; choose one of {quickstart_experiments()}")
    with _no_toy_files():
        exp = build_config(name, overrides).initial_setup()
    toy = not any(override_key(o) in DATA_PATH_KEYS for o in overrides)
    configs = {
        role: model_config(spec, _toy_fallback(spec, exp.fileroot) if toy else None)
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
    print(head + ("" if not toy else " (toy task: toy checkpoints not trained yet count as the toy model)"))
    print(format_plan(memory, limit))
    check_fits(memory, limit)
    peak = max(w.peak for w in memory.workers)
    return f"fits: largest worker peak {peak / GiB:.2f} GiB <= {limit / GiB:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    from omegaconf.errors import OmegaConfBaseException

    from realrl.apps.errors import EXIT_USER_ERROR, one_line

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        print(plan(argv))
    except (ValueError, LookupError, OmegaConfBaseException) as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
