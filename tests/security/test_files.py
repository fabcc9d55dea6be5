"""The run's files: owner-only, never through a link, refused when another user could write them;
configs are JSON that names only realrl's and the plugins' classes; recover points load without
running code."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import stat
import subprocess
import sys

import pytest
import torch

from realrl.api.core.dfg import ModelInterfaceType
from realrl.apps.errors import EXIT_USER_ERROR
from realrl.apps.main import main as main_cli
from realrl.base import config_json, private_files
from realrl.base.private_files import UnsafePathError, check_private_dir, make_private_dirs, unsafe_reason
from realrl.impl.model.backend.checkpoint import load_state, rng_state, save_state
from realrl.impl.model.backend.integrity import CheckpointError


class Boom:
    """Unpickling this writes a file: proof that something was (or was not) unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@dataclasses.dataclass
class RunningMean:
    """State an interface might save as an object of its own: a recover point cannot hold it."""

    mean: float


def plugin_that_writes(tmp_path, marker) -> str:
    """A plugin file whose import writes ``marker``: proof that a config's plugins were imported."""
    plugin = tmp_path / "touch_plugin.py"
    plugin.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return str(plugin)


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
    link = tmp_path / "worker_configs.json"
    os.symlink(target, link)
    with pytest.raises(UnsafePathError):
        private_files.write_private(str(link), b"ours")
    assert target.read_bytes() == b"theirs"
    path = tmp_path / "mine.json"
    private_files.write_private(str(path), b"one")
    private_files.write_private(str(path), b"two")  # a rerun replaces our own file
    assert path.read_bytes() == b"two" and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def run_remote(configs, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "realrl.apps.remote", str(configs), "0"],
        input=b"00" * 32 + b"\n",
        capture_output=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_a_worker_refuses_configs_others_may_write_and_pickles(tmp_path):
    """The worker configs name plugins to import: a copy every user may write is refused before
    anything is imported, and a pickle in its place is refused as not JSON, never unpickled."""
    marker = tmp_path / "imported"
    configs = tmp_path / "worker_configs.json"
    configs.write_text(config_json.dumps([], plugin_modules=[plugin_that_writes(tmp_path, marker)]))
    os.chmod(configs, 0o666)
    proc = run_remote(configs, tmp_path)
    assert proc.returncode != 0 and b"every user may write" in proc.stderr
    assert not marker.exists()
    unpickled = tmp_path / "unpickled"
    configs.unlink()
    configs.write_bytes(pickle.dumps(Boom(str(unpickled))))
    os.chmod(configs, 0o600)
    proc = run_remote(configs, tmp_path)
    assert proc.returncode != 0 and b"not a JSON config" in proc.stderr
    assert not unpickled.exists()


def test_a_config_names_only_realrl_s_and_its_plugins_classes(tmp_path):
    """A class outside realrl and the file's own plugin modules is refused by name, before it is
    imported; so is something in realrl that is not a dataclass (a function)."""
    for name in ("subprocess:Popen", "os:system", "realrl.base.private_files:write_private"):
        text = json.dumps({"format": config_json.FORMAT, "value": {"$dataclass": name, "attrs": {}}})
        with pytest.raises(config_json.ConfigFormatError, match="refusing class|is not a dataclass"):
            config_json.loads(text)
    marker = tmp_path / "imported"
    plugin = plugin_that_writes(tmp_path, marker)
    text = config_json.dumps([], plugin_modules=[plugin])
    assert config_json.loads(text) == [] and not marker.exists()  # a reader that imports no plugins


def test_values_json_cannot_say_are_named_where_they_are():
    with pytest.raises(config_json.ConfigFormatError, match=r"value\[0\]\['fn'\]: a builtins.function"):
        config_json.dumps([{"fn": lambda: 0}])
    odd = {
        "t": (1, 2.5, None),
        "s": {3, 1},
        "f": frozenset({"a"}),
        "b": b"\x00\xff",
        "k": {(1, 2): "x", 3: [4]},
        "tag": {"$tuple": 1},
        "inf": float("inf"),
    }
    assert config_json.loads(config_json.dumps(odd)) == odd
    back = config_json.loads(config_json.dumps([ModelInterfaceType.GENERATE]))
    assert type(back[0]) is ModelInterfaceType  # a str enum stays an enum, not its string


def test_recover_point_files_load_without_running_code(tmp_path):
    """Every ``*.pt`` of a recover point (RNG, extra, engine and interface state) loads with
    ``weights_only``: a pickle payload is refused naming the file, and nothing runs."""
    good = tmp_path / "rng_state_rank0.pt"
    torch.save(rng_state(), good)
    assert set(load_state(str(good))) >= {"python", "numpy", "torch"}
    marker = tmp_path / "unpickled"
    for name in (
        "rng_state_rank1.pt",
        "extra_state_rank0.pt",
        "engine_state.pt",
        "actor_train.rank0.state.pt",
    ):
        bad = tmp_path / name
        torch.save({"state": Boom(str(marker))}, bad)
        with pytest.raises(CheckpointError, match=f"{name}: cannot be read back"):
            load_state(str(bad))
    assert not marker.exists()


def test_state_a_recover_point_could_not_load_is_refused_when_written(tmp_path):
    """An interface's state of a type ``weights_only`` refuses fails at the save, naming the type,
    not at the resume that needs it."""
    state = {"mean": torch.zeros(2), "n": 3, "tag": "x", "nested": [(1, 2.0)]}
    save_state(state, str(tmp_path / "ok.pt"), "ok state")
    assert load_state(str(tmp_path / "ok.pt"))["nested"] == [(1, 2.0)]
    with pytest.raises(
        CheckpointError, match=r"the state of MyInterface holds .*RunningMean.*weights_only=True"
    ):
        save_state({"x": RunningMean(0.0)}, str(tmp_path / "bad.pt"), "the state of MyInterface")


def test_the_command_line_runs_json_configs_only(tmp_path, capsys):
    """``python -m realrl.apps.main`` refuses a pickle (not JSON, never unpickled) and a JSON
    config another user may write (it names plugins to import), exiting 2 with one line."""
    unpickled = tmp_path / "unpickled"
    config = tmp_path / "config.pkl"
    config.write_bytes(pickle.dumps(Boom(str(unpickled))))
    with pytest.raises(SystemExit) as info:
        main_cli([str(config)])
    assert info.value.code == EXIT_USER_ERROR and "not a JSON config" in capsys.readouterr().err
    assert not unpickled.exists()
    imported = tmp_path / "imported"
    config = tmp_path / "config.json"
    config.write_text(config_json.dumps([], plugin_modules=[plugin_that_writes(tmp_path, imported)]))
    os.chmod(config, 0o666)
    with pytest.raises(SystemExit) as info:
        main_cli([str(config)])
    assert info.value.code == EXIT_USER_ERROR and "every user may write" in capsys.readouterr().err
    assert not imported.exists()
