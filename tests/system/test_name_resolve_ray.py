"""The Ray KV name_resolve backend (driver side; actors see the same store)."""

from __future__ import annotations

import pytest

from realrl.base.name_resolve import NameEntryExistsError, NameEntryNotFoundError, NameResolveTimeoutError


def test_ray_kv_backend(ray_cluster):
    from realrl.base.name_resolve_ray import RayNameRecordRepository

    repo = RayNameRecordRepository("realrl-test")
    repo.clear_subtree("exp")
    repo.add("exp/trial/master", "tcp://1.2.3.4:5")
    with pytest.raises(NameEntryExistsError):
        repo.add("exp/trial/master", "other")
    repo.add("exp/trial/master", "tcp://1.2.3.4:6", replace=True)
    assert repo.get("exp/trial/master") == "tcp://1.2.3.4:6"
    repo.add("exp/trial/workers/0", "a")
    repo.add("exp/trialX/workers/0", "not under exp/trial")
    assert repo.find_subtree("exp/trial") == ["exp/trial/master", "exp/trial/workers/0"]
    assert RayNameRecordRepository("another-namespace").find_subtree("exp") == []
    repo.delete("exp/trial/workers/0")
    with pytest.raises(NameEntryNotFoundError):
        repo.get("exp/trial/workers/0")
    with pytest.raises(NameEntryNotFoundError):
        repo.delete("exp/trial/workers/0")
    with pytest.raises(NameResolveTimeoutError):
        repo.wait("exp/trial/never", timeout=0.2)
    repo.clear_subtree("exp")
    assert repo.find_subtree("exp") == []
