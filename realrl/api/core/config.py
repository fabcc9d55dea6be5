"""Names and abstractions handed from experiment configs to workers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, order=True)
class ModelName:
    """A model's role ("actor", "critic", "ref", "reward") and which replica of it."""

    role: str
    replica_id: int = 0

    def __post_init__(self) -> None:
        if not self.role or "@" in self.role:
            raise ValueError(f"ModelName.role must be a non-empty string without '@', got {self.role!r}")
        if self.replica_id < 0:
            raise ValueError(f"ModelName.replica_id must be >= 0, got {self.replica_id}")

    def __str__(self) -> str:
        return f"{self.role}@{self.replica_id}"

    @classmethod
    def parse(cls, name: str | ModelName) -> ModelName:
        """``"actor"`` or ``"actor@1"`` -> ModelName."""
        if isinstance(name, ModelName):
            return name
        role, _, rep = name.partition("@")
        return cls(role, int(rep) if rep else 0)


@dataclasses.dataclass(frozen=True, order=True)
class ModelShardID:
    """One shard of a model in its data / tensor / pipeline parallel layout."""

    model_name: ModelName
    dp_rank: int = 0
    tp_rank: int = 0
    pp_rank: int = 0
    dp_size: int = 1
    tp_size: int = 1
    pp_size: int = 1

    def __post_init__(self) -> None:
        for rank, size, what in [
            (self.dp_rank, self.dp_size, "dp"),
            (self.tp_rank, self.tp_size, "tp"),
            (self.pp_rank, self.pp_size, "pp"),
        ]:
            if size < 1 or not 0 <= rank < size:
                raise ValueError(f"ModelShardID: {what}_rank {rank} out of range for size {size}")

    def __str__(self) -> str:
        return f"{self.model_name}:d{self.dp_rank}t{self.tp_rank}p{self.pp_rank}"


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """A model architecture family (a ``register_hf_family`` name), its size and head kind."""

    _class: str
    size: int = 0
    is_critic: bool = False

    def __str__(self) -> str:
        return f"{self._class}-{self.size}{'-critic' if self.is_critic else ''}"


@dataclasses.dataclass
class _Abstraction:
    """A registered name plus the keyword arguments its constructor gets."""

    type_: str
    args: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.type_, str) or not self.type_:
            raise ValueError(f"{type(self).__name__}.type_ must be a registered name, got {self.type_!r}")
        self.args = dict(self.args)


def setting_holder(args: Any, key: str) -> Mapping[str, Any]:
    """The first mapping holding ``key`` in an abstraction's nested arguments (dicts, lists and the
    typed hyperparameter dataclasses, e.g. ``ppo.gen.max_new_tokens``); {} if none."""
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        args = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    if isinstance(args, Mapping) and key in args:
        return args
    values = args.values() if isinstance(args, Mapping) else args if isinstance(args, list | tuple) else ()
    return next((h for v in values if (h := setting_holder(v, key))), {})


@dataclasses.dataclass
class DatasetAbstraction(_Abstraction):
    pass


@dataclasses.dataclass
class ModelInterfaceAbstraction(_Abstraction):
    pass


@dataclasses.dataclass
class ModelBackendAbstraction(_Abstraction):
    pass


@dataclasses.dataclass
class ModelAbstraction(_Abstraction):
    """How to build a model: a ``register_model`` name (e.g. "real_model") and its arguments."""
