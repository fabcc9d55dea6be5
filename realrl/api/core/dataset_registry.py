"""The dataset registry: datasets register by name and are built from ``DatasetAbstraction``.

A dataset is ``cls(util: DatasetUtility, **args)``; ``make_dataset`` builds the ``DatasetUtility``
(seed, data-parallel shard, tokenizer) and passes the config's arguments. Re-exported by
``realrl.api.core.data_api`` (the stable import path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from realrl.api.core.config import DatasetAbstraction
from realrl.api.core.tokenizer import load_hf_tokenizer
from realrl.base.registry import Registry

if TYPE_CHECKING:  # the registry names datasets; only a worker builds one
    import torch


@dataclasses.dataclass
class DatasetUtility:
    """What every dataset constructor receives first: seed, its shard and the tokenizer."""

    seed: int
    dp_rank: int
    world_size: int
    tokenizer: Any

    def __post_init__(self) -> None:
        if not 0 <= self.dp_rank < self.world_size:
            raise ValueError(f"dp_rank {self.dp_rank} out of range for world_size {self.world_size}")


_DATASETS: Registry[Callable[..., torch.utils.data.Dataset]] = Registry("dataset")


def register_dataset(name: str, dataset_cls: Callable[..., torch.utils.data.Dataset]) -> None:
    _DATASETS.register(name, dataset_cls)


def registered_datasets() -> list[str]:
    return _DATASETS.names()


def make_dataset(
    cfg: DatasetAbstraction | str,
    seed: int,
    dp_rank: int,
    world_size: int,
    tokenizer_or_tokenizer_name: Any,
    **extra_args: Any,
) -> torch.utils.data.Dataset:
    """Construct a registered dataset: ``cls(util, **cfg.args)``."""
    if isinstance(cfg, str):
        cfg = DatasetAbstraction(cfg)
    tokenizer = tokenizer_or_tokenizer_name
    if isinstance(tokenizer, str):
        tokenizer = load_hf_tokenizer(tokenizer)
    util = DatasetUtility(seed, dp_rank, world_size, tokenizer)
    try:
        return _DATASETS.get(cfg.type_)(util, **cfg.args, **extra_args)
    except TypeError as e:
        raise TypeError(f"dataset {cfg.type_!r} rejected its arguments {sorted(cfg.args)}: {e}") from e
