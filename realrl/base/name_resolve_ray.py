"""name_resolve on Ray's key-value store: what workers of a ``mode=ray`` run use to find each other.

Every process connected to the cluster (the driver and every actor) sees the same store, so no
shared file system is needed. Names live in their own KV namespace.
"""

from __future__ import annotations

from realrl.base.name_resolve import (
    NameEntryExistsError,
    NameEntryNotFoundError,
    NameRecordRepository,
    _check_name,
)


class RayNameRecordRepository(NameRecordRepository):
    def __init__(self, namespace: str = "realrl"):
        import ray
        from ray.experimental import internal_kv

        if not ray.is_initialized():
            raise RuntimeError("the Ray name_resolve backend needs ray.init() first (driver) or a Ray actor")
        self._kv = internal_kv
        self.namespace = namespace

    def add(self, name: str, value: str, replace: bool = False) -> None:
        name = _check_name(name)
        added = self._kv._internal_kv_put(name, str(value), overwrite=replace, namespace=self.namespace)
        if added is True and not replace:  # put returns True when the key already existed
            raise NameEntryExistsError(f"name {name!r} already exists")

    def get(self, name: str) -> str:
        name = _check_name(name)
        value = self._kv._internal_kv_get(name, namespace=self.namespace)
        if value is None:
            raise NameEntryNotFoundError(f"name {name!r} not found in Ray KV namespace {self.namespace!r}")
        return value.decode()

    def delete(self, name: str) -> None:
        name = _check_name(name)
        if not self._kv._internal_kv_del(name, namespace=self.namespace):
            raise NameEntryNotFoundError(f"name {name!r} not found in Ray KV namespace {self.namespace!r}")

    def find_subtree(self, prefix: str) -> list[str]:
        prefix = _check_name(prefix)
        keys = [k.decode() for k in self._kv._internal_kv_list(prefix, namespace=self.namespace)]
        return sorted(k for k in keys if k == prefix or k.startswith(prefix + "/"))
