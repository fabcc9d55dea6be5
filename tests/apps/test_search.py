"""Execution-plan search from the command line: the profile cache (measured once per experiment,
models, shapes and hardware; a missing layout alone is run), ``python -m realrl.apps.search``
printing plans to paste, and ``allocation_mode=search`` running the best plan."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from realrl.api.core.layout import Layout
from realrl.apps.configs import build_config, register_everything
from realrl.apps.plan_search.cost_table import Shape, load
from realrl.apps.plan_search.profiles import drift, profile
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


def _sft(tmp_path, *overrides: str):
    register_everything()
    cfg = build_config("sft", [f"fileroot={tmp_path}", *TINY[:1], *overrides])
    return cfg, plan_phases("sft", cfg)[-1].experiment


def test_the_profile_is_measured_once_and_a_missing_layout_alone_is_run(tmp_path):
    cfg, exp = _sft(tmp_path, "dataset.train_bs_n_seqs=8")
    ran: list[str] = []
    run = _fake_run({"trainDefault": 0.05}, ran)
    first, path, _ = profile("sft", cfg, exp, [Layout(), Layout(2)], 2, run)
    assert ran == ["d1m1p1", "d2m1p1"] and os.path.isfile(path)
    shape = Shape.of(exp)
    assert first.point(shape).calls == {("trainDefault", "d1m1p1"): 0.05, ("trainDefault", "d2m1p1"): 0.05}
    # a step is 0.1 s, its one call 0.05 s: the rest is overhead, and the cost carries it
    assert first.point(shape).scale["d1m1p1"] == pytest.approx(2.0)
    assert first.costs(shape).calls[("trainDefault", "d1m1p1")] == pytest.approx(0.1)
    again, same_path, runs = profile("sft", cfg, exp, [Layout(), Layout(2)], 2, run)
    assert (runs, same_path) == ([], path) and again.points == first.points  # cached: nothing runs
    _, _, runs = profile("sft", cfg, exp, [Layout(), Layout(2), Layout(1, 2)], 2, run)
    assert runs == ["d1m2p1"]  # only what the cache lacks
    slower, _, runs = profile(
        "sft", cfg, exp, [Layout()], 2, _fake_run({"trainDefault": 0.08}, []), fresh=True
    )
    assert runs == ["d1m1p1"]  # search.reprofile: measured again, the cached table replaced
    assert load(path).point(shape).calls == {("trainDefault", "d1m1p1"): 0.08} == slower.point(shape).calls


def test_the_best_plan_of_each_kind_within_the_simulator_s_error_runs_too():
    """A fitted contention can rank every overlapping plan below a row of sequential ones; the
    best overlapping plan still runs when predicted within 15 % of the best (and vice versa)."""
    from realrl.apps.plan_search.choose import to_verify
    from realrl.apps.plan_search.search import Candidate
    from realrl.apps.plan_search.simulator import Simulation

    def plan(mode: str, seconds: float, overlap: float) -> Candidate:
        return Candidate(mode, Simulation(seconds, {"train": seconds}, 0.0, {}, overlap), None)

    sequential = [plan(f"seq{i}", 0.60 + 0.01 * i, 0.0) for i in range(4)]
    side_by_side = plan("overlap", 0.66, 0.4)
    assert to_verify([*sequential, side_by_side], 3) == ["seq0", "seq1", "seq2", "overlap"]
    assert to_verify([*sequential, plan("overlap", 0.70, 0.4)], 3) == ["seq0", "seq1", "seq2"]  # 17 % behind
    overlapping = [plan(f"ov{i}", 0.50 + 0.01 * i, 0.3) for i in range(3)]
    assert to_verify([*overlapping, plan("seq", 0.55, 0.0)], 2) == [
        "ov0",
        "ov1",
        "seq",
    ]  # the other way round
    assert to_verify([*sequential[:1], side_by_side], 3) == ["seq0", "overlap"]  # no plan twice
    assert to_verify([], 3) == []


def test_plans_that_all_miss_their_predictions_one_way_flag_a_stale_profile():
    predicted = {"a": 1.0, "b": 2.0, "c": 4.0}
    assert drift(predicted, {"a": 1.3, "b": 2.5, "c": 4.8}) == pytest.approx(0.25)  # all 20-30 % slower
    assert drift(predicted, {"a": 0.7, "b": 1.6}) == pytest.approx(-0.25)
    assert drift(predicted, {"a": 1.3, "b": 1.9}) is None  # one within 15 %: noise, not a stale table
    assert drift(predicted, {"a": 1.3, "b": 1.5}) is None  # both ways
    assert drift(predicted, {}) is None


def _sized_run(per_token: float, fixed: float, ran: list[str]):
    """A profiling run whose call takes ``fixed + per_token * tokens`` seconds, a step twice that."""

    def run(cfg):
        ran.append(f"{cfg.allocation_mode}@{cfg.dataset.train_bs_n_seqs}")
        exp = plan_phases("sft", cfg)[-1].experiment
        seconds = fixed + per_token * Shape.of(exp).tokens("trainDefault")
        return [
            {"step": i + 1, "time": 2 * seconds * i, "timing": {"trainDefault": seconds}} for i in range(8)
        ]

    return run


def test_a_new_batch_size_is_interpolated_within_reach_and_profiled_beyond(tmp_path):
    """One table serves every batch size: measured at 8 and 32 sequences, 16 is interpolated
    (nothing runs) and exact for a call linear in its tokens; 128 is beyond reach and is run."""
    ran: list[str] = []
    run = _sized_run(per_token=1e-4, fixed=0.02, ran=ran)
    paths = set()
    for n in (8, 32):
        cfg, exp = _sft(tmp_path, f"dataset.train_bs_n_seqs={n}")
        _, path, _ = profile("sft", cfg, exp, [Layout()], 1, run)
        paths.add(path)
    assert len(paths) == 1 and ran == ["d1m1p1@8", "d1m1p1@32"]  # one table, two shapes
    cfg, exp = _sft(tmp_path, "dataset.train_bs_n_seqs=16")
    table, _, runs = profile("sft", cfg, exp, [Layout()], 1, run)
    assert runs == []
    want = 2 * (0.02 + 1e-4 * Shape.of(exp).tokens("trainDefault"))
    assert table.costs(Shape.of(exp)).calls[("trainDefault", "d1m1p1")] == pytest.approx(want)
    _, _, runs = profile("sft", cfg, exp, [Layout()], 1, run, interpolate=False)
    assert runs == ["d1m1p1"]  # asked to measure: measured (and exact from then on)
    cfg, exp = _sft(tmp_path, "dataset.train_bs_n_seqs=128")
    _, _, runs = profile("sft", cfg, exp, [Layout()], 1, run)
    assert runs == ["d1m1p1"] and ran[-1] == "d1m1p1@128"


def test_the_contention_is_the_one_that_replays_the_measured_overlapping_plan(tmp_path):
    """PPO with the critic's calls on worker 1: its training overlaps the actor's. Runs measured
    at the step the simulator makes with contention 1.5 give back 1.5, kept in the table; a plan
    in which nothing overlaps cannot tell, and says so."""
    import dataclasses

    from realrl.apps.plan_search.profiles import calibrate_contention
    from realrl.apps.plan_search.simulator import simulate
    from realrl.apps.plan_search.space import with_allocation

    register_everything()
    cfg = build_config("ppo", [f"fileroot={tmp_path}", *TINY])
    exp = plan_phases("ppo", cfg)[-1].experiment
    seconds = {m.name: 0.05 for m in exp.mfcs}
    table, path, _ = profile("ppo", cfg, exp, [Layout()], 1, _fake_run(seconds, []))
    split = "critic_inf:d1m1p1@1,critic_train:d1m1p1@1,*:d1m1p1"
    costs = dataclasses.replace(table.costs(Shape.of(exp)), contention=1.5)
    step = simulate(with_allocation(exp, split), costs).step_seconds
    measured = [{"step": i + 1, "time": step * i, "timing": {}} for i in range(8)]
    assert calibrate_contention(cfg, exp, table, path, split, lambda c: measured) == pytest.approx(1.5)
    assert load(path).contention == pytest.approx(1.5)
    with pytest.raises(ValueError, match="nothing overlaps"):
        calibrate_contention(cfg, exp, table, path, "d1m1p1", lambda c: measured)


def test_the_plan_chosen_is_the_fastest_of_the_best_predicted_run_briefly(tmp_path):
    """The search's top predictions run briefly (once: the seconds are cached) and the fastest
    measured is the plan to run, whatever the prediction said."""
    from realrl.apps.plan_search.choose import PlanSearch
    from realrl.apps.plan_search.profiles import measure_plans
    from realrl.apps.plan_search.search import search

    cfg, exp = _sft(tmp_path, "dataset.train_bs_n_seqs=8")
    table, path, _ = profile("sft", cfg, exp, [Layout(), Layout(2)], 2, _fake_run({"trainDefault": 0.05}, []))
    result = search(exp, table.costs(Shape.of(exp)), 2)
    modes = [c.allocation_mode for c in result.ranked]
    gap = {m: 0.3 - 0.1 * i for i, m in enumerate(modes)}  # the worst predicted runs fastest
    ran: list[str] = []

    def run(c):
        ran.append(c.allocation_mode)
        return [{"step": i + 1, "time": gap[c.allocation_mode] * i} for i in range(8)]

    measured, runs = measure_plans(cfg, exp, table, path, modes, run)
    assert runs == ran == modes and measured == pytest.approx(gap)
    assert measure_plans(cfg, exp, load(path), path, modes, run)[1] == []  # cached
    found = PlanSearch(result, exp, table.costs(Shape.of(exp)), measured=measured)
    assert found.best.allocation_mode == modes[-1] != result.ranked[0].allocation_mode
    assert PlanSearch(result, exp, table.costs(Shape.of(exp))).best is result.ranked[0]


def _search_command(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "realrl.apps.search", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # the search itself runs in the default suite through benchmarks/bench_search.py's smoke test
def test_the_search_command_prints_plans_to_paste_best_first(shared_root):
    # no time limit: every plan runs briefly however loaded the machine
    done = _search_command(
        "sft", f"fileroot={shared_root}", *TINY, "n_nodes=1", "n_gpus_per_node=2", "time_limit_s=null"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "allocation_mode" in line]
    rows = [r for r in rows if not r.startswith("| rank")]
    assert len(rows) == 3  # d1 on a worker, d2 and d1m2 over both
    times = [float(r.split("|")[2]) for r in rows]
    assert times == sorted(times) and all(t > 0 for t in times)
    measured = {r.split("|")[-2].strip(): float(r.split("|")[3]) for r in rows}  # all 3 run briefly
    fastest = min(measured, key=measured.__getitem__)
    assert f"chosen: {fastest[1:-1]} (the fastest of the 3 best predicted, run briefly)" in done.stdout
    assert {r.split("|")[-2].strip() for r in rows} == {
        "'allocation_mode=d1m1p1'",
        "'allocation_mode=d2m1p1'",
        "'allocation_mode=d1m2p1'",
    }
    bad = _search_command("sft", f"fileroot={shared_root}", "n_gpus_per_node=0")
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "n_gpus_per_node" in bad.stderr


def test_allocation_mode_search_runs_the_best_plan_and_says_which(shared_root):
    """The search picks a plan and the run takes it. (The plans run briefly and the contention
    measurement are left to bench_search.py's smoke test: here the best predicted plan runs.)"""
    register_everything()
    search = [
        "allocation_mode=search",
        "search.n_gpus_per_node=2",
        "search.verify=0",
        "search.contention=false",
    ]
    cfg = build_config("sft", [f"fileroot={shared_root}", *TINY, *search])
    from realrl.apps.quickstart import Command, searched

    command = searched(Command("sft", cfg))
    chosen = command.config.allocation_mode
    assert chosen in ("d1m1p1", "d2m1p1", "d1m2p1")
    summary = run_quickstart("sft", command.config)
    assert summary["allocation_mode"] == chosen
    with open(os.path.join(command.config.run_dir, "summary.json")) as f:
        assert json.load(f)["allocation_mode"] == chosen


def test_plans_for_a_cluster_on_paper_need_no_run_and_score_hand_plans_beside(tmp_path):
    """``costs=paper``: 7B PPO on 8 x H100 from config files alone (no weights, no data, nothing
    runs); the hand-made plans are scored beside the search, the one over memory with its need."""
    model = "examples/configs/llama-2-7b"
    roles = [f"{r}.path={model}" for r in ("actor", "critic", "ref", "rew")]
    done = _search_command(
        "ppo", *roles, "dataset.path=prompts.jsonl", f"fileroot={tmp_path}", "n_nodes=1", "n_gpus_per_node=8",
        "costs=paper", "iterations=300", "top=2", 'compare=["actor:d1m8p1,*:d2m4p1","d8m1p1"]',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("ppo on 8 workers:") and "a Metropolis search" in out, out
    rows = [line for line in out.splitlines() if line.startswith("| ")][2:]
    best, hand = rows[0], next(r for r in rows if "actor:d1m8p1,*:d2m4p1" in r)
    assert hand.startswith("| ~") and float(best.split("|")[2]) <= float(hand.split("|")[2])
    assert re.search(r"d8m1p1: needs \d+\.\d+ GiB on a device of 80\.00 GiB", out), out
    assert not os.path.exists(tmp_path / "plan_profiles")  # nothing was profiled
    unknown = _search_command("ppo", *roles, "dataset.path=prompts.jsonl", "costs=paper", "hardware=tpu")
    assert unknown.returncode == 2 and "search.hardware='tpu'" in unknown.stderr
