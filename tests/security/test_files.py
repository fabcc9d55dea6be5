"""The run's files: owner-only, never through a link, refused when another user could write them;
RNG state loaded without running code; no secret in a fresh worker's environment."""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys

import pytest
import torch

from realrl.base import private_files
from realrl.base.private_files import UnsafePathError, check_private_dir, make_private_dirs, unsafe_reason
from realrl.impl.model.backend.checkpoint import _torch_load, rng_state
from realrl.impl.model.backend.integrity import CheckpointError


class Boom:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def fake_stat(uid: int, gid: int, mode: int) -> os.stat_result:
    return os.stat_result((stat.S_IFDIR | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


def test_unsafe_reason_names_another_owner_and_writers():
    """Ownership without chown: the rule on a folder's status, for any user running the tests."""
    assert unsafe_reason(fake_stat(1000, 1000, 0o700), 1000, 1000) is None
    assert unsafe_reason(fake_stat(1000, 1000, 0o775), 1000, 1000) is None  # umask 002, own group
    assert "belongs to uid 0" in unsafe_reason(fake_stat(0, 0, 0o700), 1000, 1000)
    assert "every user may write" in unsafe_reason(fake_stat(1000, 1000, 0o1777), 1000, 1000)
    assert "group 27 may write" in unsafe_reason(fake_stat(1000, 27, 0o770), 1000, 1000)


def test_make_private_dirs_creates_owner_only_folders_and_refuses_a_planted_link(tmp_path):
    run = tmp_path / "root" / "exp" / "trial" / "logs"
    make_private_dirs(str(run), str(tmp_path / "root"))
    for d in (tmp_path / "root", run.parent, run):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    other = tmp_path / "elsewhere"
    other.mkdir()
    os.chmod(other, 0o777)
    os.symlink(other, tmp_path / "root" / "exp2")  # a link to a folder everyone may write
    with pytest.raises(UnsafePathError, match="every user may write"):
        make_private_dirs(str(tmp_path / "root" / "exp2" / "t"), str(tmp_path / "root"))
    with pytest.raises(UnsafePathError):
        check_private_dir(str(other))


def test_write_private_is_owner_only_and_never_follows_a_link(tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"theirs")
    link = tmp_path / "worker_configs.pkl"
    os.symlink(target, link)
    with pytest.raises(UnsafePathError):
        private_files.write_private(str(link), b"ours")
    assert target.read_bytes() == b"theirs"
    path = tmp_path / "mine.pkl"
    private_files.write_private(str(path), b"one")
    private_files.write_private(str(path), b"two")  # a rerun replaces our own file
    assert path.read_bytes() == b"two" and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_worker_refuses_configs_others_may_write(tmp_path):
    """``worker_configs.pkl`` is unpickled: a copy every user may write is refused before that."""
    marker = tmp_path / "unpickled"
    configs = tmp_path / "worker_configs.pkl"
    configs.write_bytes(pickle.dumps(Boom(str(marker))))
    os.chmod(configs, 0o666)
    proc = subprocess.run(
        [sys.executable, "-m", "realrl.apps.remote", str(configs), "0"],
        input=b"00" * 32 + b"\n",
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode != 0 and b"every user may write" in proc.stderr
    assert not marker.exists()


def test_rng_state_loads_without_running_code(tmp_path):
    good = tmp_path / "rng_state_rank0.pt"
    torch.save(rng_state(), good)
    assert set(_torch_load(str(good), weights_only=True)) >= {"python", "numpy", "torch"}
    marker = tmp_path / "unpickled"
    bad = tmp_path / "rng_state_rank1.pt"
    torch.save({"python": Boom(str(marker))}, bad)
    with pytest.raises(CheckpointError, match="cannot be read back"):
        _torch_load(str(bad), weights_only=True)
    assert not marker.exists()


def test_the_command_line_refuses_a_config_pickle_others_may_write(tmp_path, capsys):
    from realrl.apps.errors import EXIT_USER_ERROR
    from realrl.apps.main import main

    marker = tmp_path / "unpickled"
    config = tmp_path / "config.pkl"
    config.write_bytes(pickle.dumps(Boom(str(marker))))
    os.chmod(config, 0o666)
    with pytest.raises(SystemExit) as info:
        main([str(config)])
    assert info.value.code == EXIT_USER_ERROR and "every user may write" in capsys.readouterr().err
    assert not marker.exists()
