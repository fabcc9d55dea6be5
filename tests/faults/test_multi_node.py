"""A Ray cluster of two nodes on this machine (a head and a second ``ray start --address`` node,
each with 2 CPUs): a run whose workers span both nodes finishes; a worker's exception reaches
the user with its own traceback; a node lost mid-run (its raylet killed) stops the run, naming
the worker that lived there, with nothing left running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from realrl.base.network import find_free_port

ray = pytest.importorskip("ray")
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.path.join(HERE, "..", "system")}


def _cluster_processes(temp_dir: str) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if temp_dir in " ".join(proc.info["cmdline"] or []):
                out.append(proc)
        except psutil.Error:
            continue
    return out


@pytest.fixture(scope="module")
def two_nodes():
    """(address, the second node's raylet process). Every process of this cluster runs under its
    own temp dir, so the teardown stops exactly them (``ray stop`` would stop the test session's
    own cluster too)."""
    if shutil.which("ray") is None:
        pytest.skip("no ray command")
    temp_dir = tempfile.mkdtemp(prefix="rr2n-")  # short: Ray's socket paths must fit 107 bytes
    port = find_free_port("127.0.0.1")
    common = ["--num-cpus=2", "--disable-usage-stats"]
    try:
        subprocess.run(
            [
                "ray",
                "start",
                "--head",
                f"--port={port}",
                f"--temp-dir={temp_dir}",
                "--include-dashboard=false",
                '--resources={"first": 1}',
                *common,
            ],
            env=ENV,
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            ["ray", "start", f"--address=127.0.0.1:{port}", '--resources={"second": 1}', *common],
            env=ENV,
            check=True,
            capture_output=True,
            timeout=120,
        )
        raylets = [p for p in _cluster_processes(temp_dir) if "raylet/raylet" in " ".join(p.cmdline())]
        second = [p for p in raylets if "second,1" in " ".join(p.cmdline())]
        assert len(raylets) == 2 and len(second) == 1, [" ".join(p.cmdline())[:200] for p in raylets]
        yield f"127.0.0.1:{port}", second[0]
    finally:
        procs = _cluster_processes(temp_dir)
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(temp_dir, ignore_errors=True)


def drive(address: str, fileroot, steps: int, *extra: str, timeout: float = 180) -> subprocess.Popen:
    cmd = [
        sys.executable,
        os.path.join(HERE, "two_node_driver.py"),
        address,
        str(fileroot),
        str(steps),
        *extra,
    ]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(proc: subprocess.Popen, timeout: float = 180) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, (out[-2000:], err[-2000:])
    return json.loads(lines[-1][len("RESULT ") :])


def test_a_run_spans_two_nodes_and_a_workers_exception_reaches_the_user(two_nodes, tmp_path):
    address, _ = two_nodes
    done = outcome(drive(address, tmp_path / "ok", 3))
    assert done["ok"] and done["steps"] == 3
    failed = outcome(drive(address, tmp_path / "raise", 3, "raise"))
    assert not failed["ok"] and failed["worker"] == "model_worker/1"
    assert "ValueError: boom from the mock interface" in failed["error"]
    assert "mock_plugins.py" in failed["error"]  # the worker's own traceback, from the other node


def test_a_node_lost_mid_run_stops_the_run_naming_its_worker(two_nodes, tmp_path):
    address, second_raylet = two_nodes
    proc = drive(address, tmp_path, 100000)
    stats = tmp_path / "systest" / "two-nodes" / "stats.jsonl"
    deadline = time.monotonic() + 120
    while not stats.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert stats.exists(), "the run never got going"
    second_raylet.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    result = outcome(proc)
    assert time.monotonic() - killed_at < 60
    assert not result["ok"] and result["worker"] in ("model_worker/0", "model_worker/1")
    # what it was doing: a request in flight, or (lost between two) the last one it answered
    doing = "while running" in result["error"] or "between requests (its last: " in result["error"]
    assert "died" in result["error"] and doing, result["error"]
    assert "runs on Ray node" in result["error"]  # the log tail says where the worker was
