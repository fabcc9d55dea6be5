"""The quickstart experiment registry: ``python -m realrl.apps.quickstart <name> key=value ...``.

Each experiment's config dataclass is also stored in hydra's ``ConfigStore`` as
``schema_name(name)``, the structured config the command line composes with hydra."""

from __future__ import annotations

import dataclasses

from realrl.base.registry import Registry

_QUICKSTART_EXPS: Registry[type] = Registry("quickstart experiment")


def schema_name(name: str) -> str:
    """The ``ConfigStore`` name of experiment ``name``'s structured config (``realrl_ppo``)."""
    return f"realrl_{name}"


def register_quickstart_exp(name: str, config_cls: type) -> type:
    """Make ``config_cls`` (a dataclass with ``initial_setup() -> ExperimentConfig``) runnable
    from the command line as ``name``."""
    from hydra.core.config_store import ConfigStore

    if not dataclasses.is_dataclass(config_cls) or not hasattr(config_cls, "initial_setup"):
        raise ValueError(
            f"quickstart experiment {name!r}: {config_cls!r} must be a dataclass with initial_setup()"
        )
    registered = _QUICKSTART_EXPS.register(name, config_cls)
    ConfigStore.instance().store(name=schema_name(name), node=config_cls)
    return registered


def get_quickstart_exp(name: str) -> type:
    return _QUICKSTART_EXPS.get(name)


def quickstart_experiments() -> list[str]:
    return _QUICKSTART_EXPS.names()
