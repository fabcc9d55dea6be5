"""Name resolving: how workers of one run find each other's addresses.

A repository maps slash-separated names ("run/trial/worker/0") to string values. The memory
backend serves tests and single-process use; the file-system backend serves every process of a
run on one machine or on a shared file system. There is deliberately no module-level default
repository: callers construct one with ``make_repository`` and pass it along.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import urllib.parse
from abc import ABC, abstractmethod

from realrl.base import private_files


class NameEntryNotFoundError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class NameEntryExistsError(ValueError):
    pass


class NameResolveTimeoutError(TimeoutError):
    pass


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip("/"):
        raise ValueError(f"a name must be a non-empty string, got {name!r}")
    return name.strip("/")


class NameRecordRepository(ABC):
    @abstractmethod
    def add(self, name: str, value: str, replace: bool = False) -> None:
        """Store ``value`` under ``name``; an existing name is an error unless ``replace``."""

    @abstractmethod
    def get(self, name: str) -> str:
        """The value of ``name``; ``NameEntryNotFoundError`` if absent."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove ``name``; ``NameEntryNotFoundError`` if absent."""

    @abstractmethod
    def find_subtree(self, prefix: str) -> list[str]:
        """Sorted names equal to ``prefix`` or under ``prefix/``."""

    def get_subtree(self, prefix: str) -> list[str]:
        """Values of ``find_subtree(prefix)``, in name order."""
        values = []
        for name in self.find_subtree(prefix):
            try:
                values.append(self.get(name))
            except NameEntryNotFoundError:
                continue  # deleted concurrently
        return values

    def clear_subtree(self, prefix: str) -> None:
        for name in self.find_subtree(prefix):
            try:
                self.delete(name)
            except NameEntryNotFoundError:
                continue

    def wait(self, name: str, timeout: float | None = None, poll_interval: float = 0.05) -> str:
        """Block until ``name`` exists; ``NameResolveTimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.get(name)
            except NameEntryNotFoundError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise NameResolveTimeoutError(
                        f"name {name!r} did not appear within {timeout} s; is the process that "
                        "publishes it running?"
                    ) from None
                time.sleep(poll_interval)


class MemoryNameRecordRepository(NameRecordRepository):
    def __init__(self) -> None:
        self._store: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, name: str, value: str, replace: bool = False) -> None:
        name = _check_name(name)
        with self._lock:
            if name in self._store and not replace:
                raise NameEntryExistsError(f"name {name!r} already exists")
            self._store[name] = str(value)

    def get(self, name: str) -> str:
        name = _check_name(name)
        with self._lock:
            if name not in self._store:
                raise NameEntryNotFoundError(f"name {name!r} not found")
            return self._store[name]

    def delete(self, name: str) -> None:
        name = _check_name(name)
        with self._lock:
            if self._store.pop(name, None) is None:
                raise NameEntryNotFoundError(f"name {name!r} not found")

    def find_subtree(self, prefix: str) -> list[str]:
        prefix = _check_name(prefix)
        with self._lock:
            return sorted(k for k in self._store if k == prefix or k.startswith(prefix + "/"))


class FileNameRecordRepository(NameRecordRepository):
    """One file per name under ``root``; writes are atomic (temp file + rename). ``root`` must be
    this user's and writable by nobody else: its entries tell workers where to connect."""

    _VALUE_FILE = "ENTRY"

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        private_files.check_private_dir(self.root)

    def _dir(self, name: str) -> str:
        parts = [urllib.parse.quote(p, safe="") for p in _check_name(name).split("/") if p]
        return os.path.join(self.root, *parts)

    def add(self, name: str, value: str, replace: bool = False) -> None:
        d = self._dir(name)
        path = os.path.join(d, self._VALUE_FILE)
        os.makedirs(d, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(str(value))
        if replace:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)  # atomic create-if-absent
        except FileExistsError:
            raise NameEntryExistsError(f"name {name!r} already exists") from None
        finally:
            os.unlink(tmp)

    def get(self, name: str) -> str:
        try:
            with open(os.path.join(self._dir(name), self._VALUE_FILE)) as f:
                return f.read()
        except FileNotFoundError:
            raise NameEntryNotFoundError(f"name {name!r} not found under {self.root}") from None

    def delete(self, name: str) -> None:
        try:
            os.unlink(os.path.join(self._dir(name), self._VALUE_FILE))
        except FileNotFoundError:
            raise NameEntryNotFoundError(f"name {name!r} not found under {self.root}") from None

    def find_subtree(self, prefix: str) -> list[str]:
        base = self._dir(prefix)
        names = []
        for dirpath, _, files in os.walk(base):
            if self._VALUE_FILE in files:
                rel = os.path.relpath(dirpath, self.root)
                names.append("/".join(urllib.parse.unquote(p) for p in rel.split(os.sep)))
        return sorted(names)

    def clear_subtree(self, prefix: str) -> None:
        super().clear_subtree(prefix)
        shutil.rmtree(self._dir(prefix), ignore_errors=True)


def make_repository(kind: str = "memory", **kwargs) -> NameRecordRepository:
    """``kind`` is ``memory`` or ``nfs`` (file system; needs ``root=``)."""
    if kind == "memory":
        return MemoryNameRecordRepository(**kwargs)
    if kind in ("nfs", "file"):
        if "root" not in kwargs:
            raise ValueError("the file-system name_resolve backend needs root=<folder>")
        return FileNameRecordRepository(**kwargs)
    raise ValueError(f"unknown name_resolve backend {kind!r}; known: memory, nfs")
