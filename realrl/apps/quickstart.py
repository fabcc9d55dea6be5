"""The command line: ``python -m realrl.apps.quickstart <experiment> key=value ...``.

Experiments are hydra structured configs registered with ``register_quickstart_exp``. Every
override is checked (unknown keys, wrong types, values outside their choices) before any worker
starts. With no dataset path the experiment runs on the embedded toy task: its preset overrides
come first, so anything on the command line still wins, and the phases it builds on (SFT, reward
model) run first unless their checkpoints are already under ``fileroot``.
"""

from __future__ import annotations

import dataclasses
import sys

from realrl.api.core.layout import Layout
from realrl.api.quickstart.entrypoint import get_quickstart_exp, quickstart_experiments
from realrl.base import logging
from realrl.system.standby import StandbyWorkers

logger = logging.getLogger("quickstart")

DATA_PATH_KEYS = ("dataset.train_path", "dataset.path")
PRESET_KEY = "ppo_preset"


def _register_everything() -> None:
    import realrl.experiments  # noqa: F401
    import realrl.impl  # noqa: F401


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def toy_overrides(config_cls: type, overrides: list[str]) -> list[str]:
    """The toy task's preset when the user names no dataset path (else nothing)."""
    if any(_override_key(o) in DATA_PATH_KEYS for o in overrides):
        return []
    # the toy model is tiny: one thread per worker beats several (per-op overhead dominates)
    return ["torch_threads=1"] + list(getattr(config_cls, "TOY_PRESET", [])) + ["trial_name=toy-seed${seed}"]


def preset_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """Expand ``ppo_preset=<name>`` into ``ppo.*`` overrides placed before the user's own."""
    from realrl.impl.interface.ppo_config import PRESETS

    rest, expanded = [], []
    for o in overrides:
        if _override_key(o) != PRESET_KEY:
            rest.append(o)
            continue
        name = o.split("=", 1)[1]
        if name not in PRESETS:
            raise SystemExit(f"error: {PRESET_KEY}={name!r} is not a preset; choose one of {sorted(PRESETS)}")
        for key, value in PRESETS[name]().items():
            if dataclasses.is_dataclass(value):
                expanded += [f"ppo.{key}.{k}={_fmt(v)}" for k, v in dataclasses.asdict(value).items()]
            else:
                expanded.append(f"ppo.{key}={_fmt(value)}")
    return expanded, rest


def _fmt(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value) if any(c in value for c in " ,=.") else value
    return str(value).lower() if isinstance(value, bool) else str(value)


def build_config(name: str, overrides: list[str]):
    """The experiment's config object from ``overrides`` (what hydra does, without a CLI; hydra's
    ``+key=value``, which adds a key to a dict option such as ``manual``, is taken too)."""
    from omegaconf import OmegaConf

    _register_everything()
    cls = get_quickstart_exp(name)
    overrides = [o[1:] if o.startswith("+") else o for o in overrides]
    expanded, overrides = preset_overrides(overrides)
    dotlist = [f"experiment_name={name}"] + toy_overrides(cls, overrides) + expanded + list(overrides)
    cfg = OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.from_dotlist(dotlist))
    return OmegaConf.to_object(cfg)


def _is_group(field: dataclasses.Field) -> bool:
    """A nested dataclass option group such as ``actor`` or ``ppo``."""
    return field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
        field.default_factory()
    )


def usage() -> str:
    lines = [
        "usage: python -m realrl.apps.quickstart <experiment> [key=value ...] [--cfg job] [--help]",
        "",
        "experiments:",
    ]
    for name in quickstart_experiments():
        cls = get_quickstart_exp(name)
        groups = [f.name for f in dataclasses.fields(cls) if _is_group(f)]
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        lines.append(f"  {name:<6} {doc}")
        lines.append(f"         groups: {', '.join(groups)}")
    lines += [
        "",
        "With no dataset path, an experiment runs on the embedded toy task (and runs the phases it",
        "needs first). 'python -m realrl.apps.quickstart <experiment> --help' lists every option;",
        "'--cfg job' prints the resolved config; ppo_preset=lm_human_preferences|grpo|real applies a preset.",
    ]
    return "\n".join(lines)


def standby_count(argv: list[str]) -> int:
    """How many standby worker processes to start before anything else (``realrl.system.standby``):
    only the raw arguments are known then. ``standby_workers=N`` decides; otherwise a local run
    gets one per worker its ``allocation_mode`` uses (one for ``manual``), a Ray run or a command
    that runs nothing (help, ``--cfg``) none."""
    if not argv or argv[0] in ("-h", "--help", "help") or any(a.startswith("-") for a in argv[1:]):
        return 0
    values = {_override_key(o): o.split("=", 1)[1] for o in argv[1:] if "=" in o}
    asked = values.get("standby_workers", "null")
    if asked.isdigit():  # anything else is left to the config's own check (or means the default)
        return int(asked)
    if values.get("mode", "local") != "local":
        return 0
    return _workers_used(values.get("allocation_mode", "d1").strip().strip("\"'"))


def _workers_used(allocation_mode: str) -> int:
    """Workers a layout string places models on (``first + dp*tp*pp`` at most); 1 if unparsable."""
    try:
        n = 1
        for part in allocation_mode.split(","):
            layout, _, first = part.rpartition(":")[2].partition("@")
            n = max(n, int(first or 0) + Layout.parse(layout).world_size)
        return n
    except ValueError:
        return 1


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # first, so that the workers' imports overlap this process's own (realrl, torch, hydra)
    n = standby_count(argv)
    standby = StandbyWorkers(n) if n else None  # None: no standby process, not even between phases
    try:
        _main(argv, standby)
    finally:
        if standby is not None:
            standby.close()


def _main(argv: list[str], standby: StandbyWorkers | None) -> None:
    _register_everything()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    name, overrides = argv[0], argv[1:]
    if name not in quickstart_experiments():
        raise SystemExit(f"error: unknown experiment {name!r}; choose one of {quickstart_experiments()}")
    import hydra
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from realrl.apps.run import run_quickstart

    cls = get_quickstart_exp(name)
    ConfigStore.instance().store(name=name, node=cls)
    expanded, rest = preset_overrides(overrides)
    hydra_args = [
        "hydra.run.dir=${fileroot}/${experiment_name}/${trial_name}",
        "hydra.output_subdir=null",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]
    defaults = [f"experiment_name={name}"] + toy_overrides(cls, rest) + expanded
    sys.argv = [f"realrl.apps.quickstart {name}"] + hydra_args + defaults + rest

    @hydra.main(version_base=None, config_name=name)
    def run(cfg) -> None:
        run_quickstart(name, OmegaConf.to_object(cfg), standby)

    run()


if __name__ == "__main__":
    main()
