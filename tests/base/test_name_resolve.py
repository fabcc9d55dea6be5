import threading
import time

import pytest

from realrl.base import name_resolve as nr


@pytest.fixture(params=["memory", "nfs"])
def repo(request, tmp_path):
    if request.param == "memory":
        return nr.make_repository("memory")
    return nr.make_repository("nfs", root=str(tmp_path / "names"))


def test_add_get_delete(repo):
    repo.add("exp/trial/master", "tcp://127.0.0.1:1234")
    assert repo.get("exp/trial/master") == "tcp://127.0.0.1:1234"
    with pytest.raises(nr.NameEntryExistsError):
        repo.add("exp/trial/master", "other")
    repo.add("exp/trial/master", "other", replace=True)
    assert repo.get("exp/trial/master") == "other"
    repo.delete("exp/trial/master")
    with pytest.raises(nr.NameEntryNotFoundError, match="exp/trial/master"):
        repo.get("exp/trial/master")
    with pytest.raises(nr.NameEntryNotFoundError):
        repo.delete("exp/trial/master")


def test_subtree(repo):
    for i in range(3):
        repo.add(f"exp/trial/worker/{i}", f"addr{i}")
    repo.add("exp/trial/workerx", "not-in-subtree")
    assert repo.find_subtree("exp/trial/worker") == [f"exp/trial/worker/{i}" for i in range(3)]
    assert repo.get_subtree("exp/trial/worker") == ["addr0", "addr1", "addr2"]
    repo.clear_subtree("exp/trial/worker")
    assert repo.find_subtree("exp/trial/worker") == []
    assert repo.get("exp/trial/workerx") == "not-in-subtree"


def test_wait_returns_when_added_and_times_out(repo):
    def later():
        time.sleep(0.2)
        repo.add("late/name", "v")

    t = threading.Thread(target=later)
    t.start()
    assert repo.wait("late/name", timeout=5) == "v"
    t.join()
    start = time.monotonic()
    with pytest.raises(nr.NameResolveTimeoutError, match="never/there"):
        repo.wait("never/there", timeout=0.3)
    assert time.monotonic() - start < 3


def test_bad_names_and_backends(tmp_path):
    repo = nr.make_repository("memory")
    with pytest.raises(ValueError):
        repo.add("", "x")
    with pytest.raises(ValueError, match="unknown name_resolve backend"):
        nr.make_repository("zookeeper")
    with pytest.raises(ValueError, match="root"):
        nr.make_repository("nfs")


def test_file_backend_shared_between_instances(tmp_path):
    a = nr.make_repository("nfs", root=str(tmp_path))
    b = nr.make_repository("nfs", root=str(tmp_path))
    a.add("run/x y/ä", "1")
    assert b.get("run/x y/ä") == "1"
    assert b.find_subtree("run") == ["run/x y/ä"]
