"""The plan search says what it will do before it does it, a line as each run starts and ends,
and keeps to ``search.time_limit_s``: runs that do not fit are skipped, the best plan of what was
measured is reported, and one line says what was skipped. Runs are faked (made-up step records)
and the clock with them: each run takes 40 s of it, no real second."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from realrl.apps.configs import build_config, register_everything
from realrl.apps.errors import UserError
from realrl.apps.plan_search.budget import DEFAULT_RUN_S, Budget
from realrl.apps.plan_search.choose import search_plan
from realrl.apps.search import format_result

TINY = ["exp_ctrl.total_train_steps=3", "dataset.train_bs_n_seqs=8"]
RUN_S = 40.0  # what each faked run takes on the faked clock


class World:
    """The faked clock, the faked runs and every line the search printed, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lines: list[str] = []
        self.runs: list[str] = []

    def clock(self) -> float:
        return self.now

    def run(self, cfg) -> list[dict]:
        self.lines.append(f"RUN {cfg.trial_name}")
        self.runs.append(cfg.allocation_mode)
        self.now += RUN_S
        seconds = 0.05 * (2 if "m2" in cfg.allocation_mode else 1)
        return [{"step": i + 1, "time": 0.1 * i, "timing": {"trainDefault": seconds}} for i in range(8)]

    def budget(self, limit_s: float | None) -> Budget:
        return Budget(limit_s, out=self.lines.append, clock=self.clock)


def _config(root, *overrides: str):
    register_everything()
    return build_config("sft", [f"fileroot={root}", *TINY, "search.n_gpus_per_node=2", *overrides])


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    """The toy task's files, written once (seconds): each test copies them into its own fileroot."""
    from realrl.apps.run import plan_phases

    root = tmp_path_factory.mktemp("task")
    plan_phases("sft", _config(root))
    return root


@pytest.fixture
def root(tmp_path, task_files):
    for folder in task_files.iterdir():
        shutil.copytree(folder, tmp_path / folder.name)
    return tmp_path


def test_the_plan_of_work_comes_before_any_run_and_each_run_says_when_it_starts_and_ends(root):
    world = World()
    found = search_plan("sft", _config(root, "search.time_limit_s=null"), world.budget(None), world.run)
    lines = world.lines
    assert lines[0].startswith("plan of work (seconds are estimates;") and "no time limit" in lines[0]
    total = next(i for i, line in enumerate(lines) if line.startswith("  total: ~"))
    first_run = next(i for i, line in enumerate(lines) if line.startswith("RUN "))
    assert total < first_run  # the whole plan is printed before anything runs
    plan = "\n".join(lines[: total + 1])
    assert "prerequisites: none to build" in plan
    assert "profiles: 3 to run (d1m1p1, d1m2p1, d2m1p1), 0 cached" in plan
    assert f"~{DEFAULT_RUN_S:.0f} s, a default; no run timed here yet" in lines[0]
    assert "verification: up to 4 plans run briefly" in plan
    for layout in ("d1m1p1", "d1m2p1", "d2m1p1"):  # a line when each run starts, one when it ends
        start = lines.index(
            next(x for x in lines if x.startswith(f"start profile of layout {layout}: 8 steps, ~"))
        )
        assert lines[start + 1] == f"RUN profile-{layout}"
        assert lines[start + 2] == f"done profile of layout {layout} in {RUN_S:.1f} s"
    verified = [x for x in lines if x.startswith("done verification run of ")]
    assert len(verified) == len(found.measured) == 3 and found.skipped is None
    assert any(x.startswith("searched ") for x in lines)

    # the next search's plan of work reads the runs' seconds from the cache, and runs nothing
    again = World()
    found = search_plan("sft", _config(root), again.budget(300.0), again.run)
    assert again.runs == [] and found.skipped is None and len(found.measured) == 3
    assert f"a short run ~{RUN_S:.0f} s, timed by earlier searches here; time limit 300 s" in again.lines[0]
    assert any("profiles: 0 to run (none), 3 cached" in x for x in again.lines)


def test_a_time_limit_skips_the_runs_that_do_not_fit_and_reports_the_best_plan_so_far(root):
    """100 s: the first profile fits the default estimate, the second the 40 s the first took;
    with 20 s left the third profile and the plans run briefly are skipped, and said so."""
    world = World()
    found = search_plan("sft", _config(root), world.budget(100.0), world.run)
    assert world.runs == ["d1m1p1", "d1m2p1"]
    assert "skip profile of layout d2m1p1: ~40 s does not fit in the 20 s left" in world.lines
    modes = [c.allocation_mode for c in found.result.ranked]
    assert modes and not any("d2" in m for m in modes)  # the layout not profiled is in no plan
    assert not any("no cost" in why for _, why in found.result.rejected)
    assert found.measured == {}
    line = found.skipped
    assert line.startswith(
        "time limit reached (search.time_limit_s=100): the best plan found so far is above"
    )
    assert "profile of layout d2m1p1" in line and "verification run of " in line and "\n" not in line
    printed = format_result("sft", 2, found.result, 10, found.measured, found.skipped)
    assert printed.splitlines()[-1] == line and "allocation_mode=d1m1p1" in printed


def test_a_limit_too_small_for_any_profile_is_one_error_line(root):
    world = World()
    with pytest.raises(UserError, match="ran out before any layout was profiled"):
        search_plan("sft", _config(root), world.budget(1.0), world.run)
    assert world.runs == []


def test_the_command_with_a_tiny_limit_prints_the_best_cached_plan_and_what_it_skipped(root):
    """Profiles cached by a search without verification; the command, limited to a millisecond,
    runs nothing: it searches until its first plan, prints it and the line of what it skipped."""
    world = World()
    search_plan("sft", _config(root, "search.verify=0"), world.budget(None), world.run)
    args = [f"fileroot={root}", *TINY, "n_nodes=1", "n_gpus_per_node=2", "time_limit_s=0.001"]
    cmd = [sys.executable, "-m", "realrl.apps.search", "sft", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "plan of work (seconds are estimates;" in done.stderr
    assert done.stderr.index("plan of work") < done.stderr.index("searching the plans")
    out = done.stdout.splitlines()
    assert out[0].startswith("sft on 2 workers:") and "stopped at the time limit" in out[0]
    assert any(row.startswith("| 1 |") for row in out)
    assert out[-1].startswith("time limit reached (search.time_limit_s=0.001)")
    assert "verification run of " in out[-1]
