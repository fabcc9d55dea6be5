"""Replay an experiment's dataflow graph in simulated time: how long a step takes under a plan.

The master's own rules decide when each call starts: a call is posted once the calls producing
its inputs are done and the parameter-version rule allows it (``VersionRule``, asynchronous RL's
bound included), each MFC's calls in step order; a call placed outside its model's home is
preceded by the reallocation the master would order (``CopyTracker``, the same object the master
uses; under asynchronous RL on CPU workers a new version is pushed, and only its receivers spend
time on it); every worker runs what it is given in posting order, one thing at a time, and a
call or a reallocation on several workers starts once it is first in line on all of them. So colocated
calls take turns and calls on disjoint workers overlap, exactly as in a run. What it needs is
what things cost (``Costs``): each call's seconds in its layout, and a reallocation's from the
bytes it moves. Data transfers between workers are not charged (they are small next to the
calls and, under asynchronous RL, pushed while the producers go on).

This is the simulator of execution-plan search ("ReaL: Efficient RLHF Training of Large Language
Models with Parameter Reallocation", MLSys 2025, replays the graph the same way).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics

from realrl.api.core.dfg import MFCDef
from realrl.api.core.layout import Placement
from realrl.api.core.system_api import ExperimentConfig
from realrl.system.copies import CopyTracker
from realrl.system.function_call import TagCounter
from realrl.system.version_rule import VersionRule


class MissingCost(KeyError):
    """No cost is known for a call in a layout: profile it first."""


@dataclasses.dataclass(frozen=True)
class Costs:
    """Seconds per call in a layout (``calls[(mfc, layout text)]``, e.g. ``("actor_gen",
    "d2m1p1")``), and the reallocations': a role's weights (``model_bytes``) over ``bandwidth``
    bytes per second, plus ``latency`` seconds each."""

    calls: dict[tuple[str, str], float]
    model_bytes: dict[str, float] = dataclasses.field(default_factory=dict)
    bandwidth: float = 1e9
    latency: float = 0.0

    def call(self, mfc: str, placement: Placement) -> float:
        key = (mfc, str(placement.layout))
        if key not in self.calls:
            raise MissingCost(f"no cost for {mfc!r} in layout {placement.layout}: profile it first")
        return self.calls[key]

    def realloc(self, role: str, home: Placement, copy: Placement) -> float:
        """The copy's workers that hold no part of home receive the whole model: an upper bound
        on what the planned reallocation moves (it sends each destination only what it lacks)."""
        share = len(set(copy.workers) - set(home.workers)) / len(copy.workers)
        return self.latency + share * self.model_bytes.get(role, 0.0) / self.bandwidth


@dataclasses.dataclass
class Simulation:
    """``step_seconds``: the mean time between steps once running (the first ``warmup`` left
    out); ``call_seconds``: each MFC's seconds per call; ``realloc_seconds``: reallocation per
    step; ``busy``: each worker's busy fraction over the steps measured."""

    step_seconds: float
    call_seconds: dict[str, float]
    realloc_seconds: float
    busy: dict[int, float]


@dataclasses.dataclass(eq=False)
class _Task:
    workers: tuple[int, ...]
    seconds: float
    call: tuple[MFCDef, int] | None = None  # None: a reallocation
    start: float | None = None


def _producers(config: ExperimentConfig) -> dict[str, list[str]]:
    """MFC -> the MFCs whose outputs it reads."""
    made_by = {k: m.name for m in config.mfcs for k in m.output_keys}
    return {m.name: sorted({made_by[k] for k in m.input_keys if k in made_by}) for m in config.mfcs}


def simulate(config: ExperimentConfig, costs: Costs, steps: int = 16, warmup: int = 4) -> Simulation:
    """Replay ``steps`` steps of ``config``'s graph under its placements; the steady step time."""
    if steps <= warmup:
        raise ValueError(f"simulate needs more steps ({steps}) than warm-up steps ({warmup})")
    rule, tracker = VersionRule(config), CopyTracker(config, TagCounter())
    producers = _producers(config)
    mfcs = list(config.mfcs)
    posted = dict.fromkeys((m.name for m in mfcs), 0)
    done = dict.fromkeys((m.name for m in mfcs), 0)
    finished: dict[tuple[str, int], float] = {}
    queues: dict[int, collections.deque[_Task]] = collections.defaultdict(collections.deque)
    running: list[tuple[float, _Task]] = []
    ran: list[tuple[float, float, _Task]] = []  # (start, end, task) of everything that ran
    now = 0.0

    def enqueue(task: _Task) -> None:
        for w in task.workers:  # one object in every worker's line: it starts when first in all
            queues[w].append(task)

    def post_ready() -> None:
        changed = True
        while changed:
            changed = False
            for m in mfcs:
                k = posted[m.name]
                if k >= steps or any((p, k) not in finished for p in producers[m.name]):
                    continue
                if not rule.ready(m, k, done, posted, steps):
                    continue
                placement = config.call_placement(m.name)
                plan = tracker.plan(m, k)
                tracker.weight_pushes(m, steps)  # its sends leave with the call: nobody waits
                for push in plan.receives if plan is not None else ():
                    # a pushed version: the copy's workers only receive it
                    enqueue(_Task(tuple(push.dst.workers), costs.realloc(m.role, push.src, push.dst)))
                if plan is not None and plan.realloc:
                    workers = tuple(sorted({*plan.home.workers, *plan.placement.workers}))
                    enqueue(_Task(workers, costs.realloc(m.role, plan.home, plan.placement)))
                enqueue(_Task(tuple(placement.workers), costs.call(m.name, placement), (m, k)))
                posted[m.name] = k + 1
                changed = True

    def start_ready() -> None:
        for w in sorted(queues):
            head = queues[w][0] if queues[w] else None
            if head is None or head.start is not None:
                continue
            if all(queues[v] and queues[v][0] is head for v in head.workers):
                head.start = now
                running.append((now + head.seconds, head))

    post_ready()
    start_ready()
    while running:
        running.sort(key=lambda e: e[0])
        now, task = running.pop(0)
        ran.append((task.start, now, task))
        for w in task.workers:
            queues[w].popleft()
        if task.call is not None:
            m, k = task.call
            finished[(m.name, k)] = now
            done[m.name] += 1
        post_ready()
        start_ready()
    stuck = [m.name for m in mfcs if posted[m.name] < steps]
    if stuck:
        raise RuntimeError(f"the simulated run stopped with calls never posted: {stuck}")
    ends = [max(t for (_, k), t in finished.items() if k == s) for s in range(steps)]
    begin, end = ends[warmup - 1], ends[-1]
    span = end - begin

    def inside(a: float, b: float) -> float:  # the part of [a, b] within the measured steps
        return max(0.0, min(b, end) - max(a, begin))

    spent = collections.defaultdict(list)
    busy = collections.Counter()
    moving = 0.0
    for a, b, t in ran:
        if t.call is not None and t.call[1] >= warmup:
            spent[t.call[0].name].append(t.seconds)
        for w in t.workers:
            busy[w] += inside(a, b)
        if t.call is None:
            moving += inside(a, b)
    return Simulation(
        step_seconds=span / (steps - warmup),
        call_seconds={name: statistics.mean(v) for name, v in spent.items()},
        realloc_seconds=moving / (steps - warmup),
        busy={w: busy[w] / span for w in sorted(busy)} if span > 0 else {},
    )
