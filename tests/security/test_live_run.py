"""Attacks on a live toy run (two mock workers, local mode) by a process of the same machine."""

from __future__ import annotations

import json
import os
import pickle
import secrets
import stat
import threading

import psutil
import pytest
import zmq
from system_graphs import mock_config, worker_pids

from realrl.apps.errors import UserError
from realrl.apps.main import SAVED_CONFIG, load_config, run_experiment
from realrl.base import config_json
from realrl.base.name_resolve import make_repository
from realrl.system import names
from realrl.system.launcher import WORKER_CONFIGS
from realrl.system.signed_messages import HEARTBEAT_SUFFIX, Codec, Message

SECRET = bytes(range(32))
LOOPBACK = {"127.0.0.1", "::1"}


class Boom:
    """Unpickling this writes a file: proof that a message was (or was not) unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class Intruder(threading.Thread):
    """Connects under every worker's guessable names and sends random, unsigned, wrongly signed
    and pickle-payload messages; records whatever the master sends it."""

    def __init__(self, address: str, marker: str):
        super().__init__(daemon=True)
        self.address, self.marker = address, marker
        self.stop, self.received, self.sent = threading.Event(), 0, 0

    def run(self) -> None:
        ctx = zmq.Context()
        socks = []
        for w in ("model_worker/0", "model_worker/1"):
            for name in (w, w + HEARTBEAT_SUFFIX):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.IDENTITY, name.encode())
                s.setsockopt(zmq.LINGER, 0)
                s.connect(self.address)
                socks.append(s)
        body = pickle.dumps(Boom(self.marker))
        junk = [
            [os.urandom(32), os.urandom(100)],
            [body],
            [b"x" * 32, body],
            Codec(b"k" * 32).encode(Message("heartbeat", "model_worker/0", to="master", seq=10**9)),
        ]
        while not self.stop.is_set():
            for s in socks:
                for frames in junk:
                    s.send_multipart(frames)
                    self.sent += 1
                while s.poll(0):
                    s.recv_multipart()
                    self.received += 1
            self.stop.wait(0.05)
        for s in socks:
            s.close()
        ctx.term()


def listening(pid: int) -> list[str]:
    return [c.laddr.ip for c in psutil.Process(pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]


def test_a_run_exposes_nothing_and_ignores_an_intruder(tmp_path, monkeypatch):
    """During a run: every socket its workers listen on (the TCPStore included) is on the
    loopback; the secret is in no worker's environment or command line; an intruder connected
    under the workers' names receives nothing, runs no pickle, and the run finishes."""
    monkeypatch.setattr(secrets, "token_bytes", lambda n: SECRET[:n])  # to look for it below
    cfg = mock_config(tmp_path, "intruded", total_train_epochs=2)
    marker = str(tmp_path / "unpickled")
    seen: dict = {}

    def on_step(record: dict, total: int) -> None:
        if record["step"] != 1:
            return
        record_dir = os.path.join(cfg.run_dir, "name_resolve")
        address = make_repository("nfs", root=record_dir).get(names.master_stream("systest", "intruded"))
        seen["intruder"] = intruder = Intruder(address, marker)
        intruder.start()
        pids = worker_pids(cfg)
        seen["pids"] = pids
        seen["listening"] = {w: listening(pid) for w, pid in pids.items()}
        for w, pid in pids.items():
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            seen[w] = SECRET.hex().encode() in environ + cmdline or b"REALRL_RUN_SECRET" in environ

    try:
        stats = run_experiment(cfg, "local", on_step=on_step)
    finally:
        if "intruder" in seen:
            seen["intruder"].stop.set()
            seen["intruder"].join(10)
    assert [s["step"] for s in stats] == list(range(1, 9))
    assert sorted(seen["pids"]) == ["model_worker/0", "model_worker/1"]
    ips = [ip for w in seen["listening"].values() for ip in w]
    assert seen["listening"]["model_worker/0"], "worker 0 serves the TCPStore: it must listen somewhere"
    assert set(ips) <= LOOPBACK, seen["listening"]
    assert not seen["model_worker/0"] and not seen["model_worker/1"]  # no secret to be read
    intruder = seen["intruder"]
    assert intruder.sent > 0 and intruder.received == 0
    assert not os.path.exists(marker)
    # what the run wrote for itself and its workers is JSON, owner-only, and rebuilds the config
    saved = os.path.join(cfg.run_dir, SAVED_CONFIG)
    assert load_config(saved) == cfg
    for path in (saved, os.path.join(cfg.run_dir, WORKER_CONFIGS)):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open(path) as f:
            assert json.load(f)["format"] == config_json.FORMAT


def test_a_hostile_fileroot_is_refused_before_anything_starts(tmp_path):
    """A fileroot every user may write (a planted ``/tmp`` folder) is refused with a clear error."""
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(UserError, match="every user may write it"):
        run_experiment(mock_config(root, "hostile"), "local")
    assert os.listdir(root) == []


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_a_fileroot_of_another_user_is_refused(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir()
    os.chown(root, 12345, 12345)
    with pytest.raises(UserError, match="belongs to uid 12345"):
        run_experiment(mock_config(root, "theirs"), "local")
    assert os.listdir(root) == []
