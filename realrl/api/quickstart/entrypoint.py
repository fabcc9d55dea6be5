"""The quickstart experiment registry: ``python -m realrl.apps.quickstart <name> key=value ...``.

Registering keeps the config dataclass only: the command line turns the one experiment it runs
into hydra's structured config when it composes (``realrl.apps.configs.compose``). Converting
every registered class up front cost over a second of each command's start-up."""

from __future__ import annotations

import dataclasses

from realrl.base.registry import Registry

_QUICKSTART_EXPS: Registry[type] = Registry("quickstart experiment")


def register_quickstart_exp(name: str, config_cls: type) -> type:
    """Make ``config_cls`` (a dataclass with ``initial_setup() -> ExperimentConfig``) runnable
    from the command line as ``name``."""
    if not dataclasses.is_dataclass(config_cls) or not hasattr(config_cls, "initial_setup"):
        raise ValueError(
            f"quickstart experiment {name!r}: {config_cls!r} must be a dataclass with initial_setup()"
        )
    return _QUICKSTART_EXPS.register(name, config_cls)


def get_quickstart_exp(name: str) -> type:
    return _QUICKSTART_EXPS.get(name)


def quickstart_experiments() -> list[str]:
    return _QUICKSTART_EXPS.names()
