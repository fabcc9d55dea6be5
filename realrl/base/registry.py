"""A named registry: what plugins use to make themselves findable by name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(LookupError):
    """A name that nothing registered; the message lists what is registered."""


class Registry(Generic[T]):
    """Maps names to objects; unknown names list the known ones, duplicates are errors."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T) -> T:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(
                f"{self.kind} {name!r} is already registered (by {self._entries[name]!r}); pick another name"
            )
        self._entries[name] = obj
        return obj

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; registered: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)
