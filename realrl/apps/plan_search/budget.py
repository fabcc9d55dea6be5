"""The plan search's time limit, and what the user sees while it works: a line as each short run
starts and ends, and the work skipped once the limit is near (the plan of work printed before
anything runs: ``work_plan.py``).

``search.time_limit_s`` counts from when the prerequisite phases (SFT, a reward model) are done:
their checkpoints are what the experiment itself trains from, so they run whatever the limit.
Within the limit, a short run (a profile, the contention run, a plan run briefly) starts only
when its estimated seconds fit in the time left; a run already started goes to its end (cut
short, its steps would measure nothing and its seconds would be lost), so the limit is overshot
by at most one run's misestimate. The search between the runs gets the time left (the best plan
scored by then). Once a run does not fit, no later one starts either: the limit is reached.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from realrl.api.quickstart.base import CommonExperimentConfig
from realrl.apps.plan_search.profiles import Runner, describe
from realrl.base import logging

logger = logging.getLogger("search")

# a short run's seconds before any was timed on this machine: the toy PPO's 8 steps on 2 CPU
# cores (workers started, four models built, the steps, the model saved)
DEFAULT_RUN_S = 45.0


def _log(line: str) -> None:
    logger.info("%s", line)


@dataclasses.dataclass
class Budget:
    """The time left for the search's runs (``limit_s`` None: no limit), and the runs' seconds."""

    limit_s: float | None = None
    out: Callable[[str], None] = _log
    clock: Callable[[], float] = time.monotonic
    recorded_s: float | None = None  # a short run's seconds, as timed by earlier searches
    run_seconds: list[float] = dataclasses.field(default_factory=list)  # the runs of this search
    skipped: list[str] = dataclasses.field(default_factory=list)  # the work not started
    start: float | None = None

    def begin(self) -> None:
        """Start the clock (after the prerequisite phases)."""
        self.start = self.clock()

    def elapsed(self) -> float:
        return 0.0 if self.start is None else self.clock() - self.start

    def left(self) -> float | None:
        """Seconds left (None: no limit); the clock starts at the first call when not begun."""
        if self.limit_s is None:
            return None
        if self.start is None:
            self.begin()
        return self.limit_s - self.elapsed()

    @property
    def reached(self) -> bool:
        return bool(self.skipped)

    def run_estimate(self) -> float:
        """A short run's seconds: the median of this search's runs, else of earlier searches'."""
        if self.run_seconds:
            return statistics.median(self.run_seconds)
        return self.recorded_s or DEFAULT_RUN_S

    def fits(self, what: str, estimate: float) -> bool:
        """Whether ``what`` (``estimate`` seconds) may start; if not, it is skipped and said so."""
        left = self.left()
        if left is not None and (self.reached or estimate > left):
            self.skipped.append(what)
            self.out(f"skip {what}: ~{estimate:.0f} s does not fit in the {max(left, 0.0):.0f} s left")
            return False
        return True

    def runner(self, run: Runner) -> Runner:
        """``run`` gated by the limit (None: not started) with a line as each run starts and ends."""

        def gated(cfg: CommonExperimentConfig) -> list[dict] | None:
            what, estimate = describe(cfg), self.run_estimate()
            if not self.fits(what, estimate):
                return None
            left = self.left()
            of = "" if left is None else f"; {left:.0f} s of the {self.limit_s:.0f} s limit left"
            steps = cfg.exp_ctrl.total_train_steps
            self.out(f"start {what}: {steps} steps, ~{estimate:.0f} s (an estimate{of})")
            began = self.clock()
            records = run(cfg)
            seconds = self.clock() - began
            self.run_seconds.append(seconds)
            self.out(f"done {what} in {seconds:.1f} s")
            return records

        return gated

    def skipped_line(self) -> str | None:
        """One line: the limit reached and the work it skipped (None: nothing skipped)."""
        if not self.skipped:
            return None
        return (
            f"time limit reached (search.time_limit_s={self.limit_s:g}): the best plan found so far is "
            f"above; skipped {len(self.skipped)}: {', '.join(self.skipped)}"
        )
