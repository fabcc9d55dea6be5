"""Execution-plan search from the command line: the profile cache (measured once per experiment,
models, shapes and hardware; a missing layout alone is run), ``python -m realrl.apps.search``
printing plans to paste, and ``allocation_mode=search`` running the best plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from realrl.api.core.layout import Layout
from realrl.apps.configs import build_config, register_everything
from realrl.apps.profiles import profile
from realrl.apps.run import plan_phases, run_quickstart

TINY = ["exp_ctrl.total_train_steps=3", "dataset.train_bs_n_seqs=8"]


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory):
    """One fileroot for the command-line tests: the second reuses the first's profiles."""
    return tmp_path_factory.mktemp("search")


def _fake_run(seconds: dict[str, float], ran: list[str]):
    """A profiling run that records what it was asked and returns made-up step records."""

    def run(cfg):
        ran.append(cfg.allocation_mode)
        per_call = {name: s * (2 if "m2" in cfg.allocation_mode else 1) for name, s in seconds.items()}
        return [{"step": i + 1, "time": 0.1 * i, "timing": dict(per_call)} for i in range(8)]

    return run


def test_the_profile_is_measured_once_and_a_missing_layout_alone_is_run(tmp_path):
    register_everything()
    cfg = build_config("sft", [f"fileroot={tmp_path}", *TINY])
    exp = plan_phases("sft", cfg)[-1].experiment
    ran: list[str] = []
    run = _fake_run({"trainDefault": 0.05}, ran)
    first, path, _ = profile("sft", cfg, exp, [Layout(), Layout(2)], 2, run)
    assert ran == ["d1m1p1", "d2m1p1"] and os.path.isfile(path)
    assert first.calls == {("trainDefault", "d1m1p1"): 0.05, ("trainDefault", "d2m1p1"): 0.05}
    assert first.scale["d1m1p1"] == pytest.approx(
        2.0
    )  # a step is 0.1 s, its one call 0.05 s: the rest is overhead
    again, same_path, runs = profile("sft", cfg, exp, [Layout(), Layout(2)], 2, run)
    assert (runs, same_path, again.calls) == ([], path, first.calls)  # cached: nothing runs
    _, _, runs = profile("sft", cfg, exp, [Layout(), Layout(2), Layout(1, 2)], 2, run)
    assert runs == ["d1m2p1"]  # only what the cache lacks
    other = build_config("sft", [f"fileroot={tmp_path}", *TINY[:1], "dataset.train_bs_n_seqs=16"])
    _, other_path, _ = profile("sft", other, plan_phases("sft", other)[-1].experiment, [Layout()], 2, run)
    assert other_path != path  # another batch shape: another profile


def _search_command(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "realrl.apps.search", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_the_search_command_prints_plans_to_paste_best_first(shared_root):
    done = _search_command("sft", f"fileroot={shared_root}", *TINY, "n_nodes=1", "n_gpus_per_node=2")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "allocation_mode" in line]
    rows = [r for r in rows if not r.startswith("| rank")]
    assert len(rows) == 3  # d1 on a worker, d2 and d1m2 over both
    times = [float(r.split("|")[2]) for r in rows]
    assert times == sorted(times) and all(t > 0 for t in times)
    assert {r.split("|")[-2].strip() for r in rows} == {
        "'allocation_mode=d1m1p1'",
        "'allocation_mode=d2m1p1'",
        "'allocation_mode=d1m2p1'",
    }
    bad = _search_command("sft", f"fileroot={shared_root}", "n_gpus_per_node=0")
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "n_gpus_per_node" in bad.stderr


def test_allocation_mode_search_runs_the_best_plan_and_says_which(shared_root):
    """With the profiles the command above cached (the same experiment, shapes and hardware):
    nothing is profiled again, only the chosen plan runs."""
    register_everything()
    cfg = build_config(
        "sft", [f"fileroot={shared_root}", *TINY, "allocation_mode=search", "search.n_gpus_per_node=2"]
    )
    from realrl.apps.quickstart import Command, searched

    command = searched(Command("sft", cfg))
    chosen = command.config.allocation_mode
    assert chosen in ("d1m1p1", "d2m1p1", "d1m2p1")
    summary = run_quickstart("sft", command.config)
    assert summary["allocation_mode"] == chosen
    with open(os.path.join(command.config.run_dir, "summary.json")) as f:
        assert json.load(f)["allocation_mode"] == chosen
