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
bytes it moves, and how much workers slow each other down when they compute side by side
(``contention``: on a CPU machine the workers share cores, caches and memory bandwidth; a task
runs ``1 + (contention - 1) * f`` times longer while a fraction ``f`` of the other workers is
busy). Data transfers between workers are not charged (they are small next to the calls and,
under asynchronous RL, pushed while the producers go on).

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
from realrl.system.transfer_plan import TagCounter
from realrl.system.version_rule import VersionRule


class MissingCost(KeyError):
    """No cost is known for a call in a layout: profile it first."""


@dataclasses.dataclass(frozen=True)
class Costs:
    """Seconds per call in a layout (``calls[(mfc, layout text)]``, e.g. ``("actor_gen",
    "d2m1p1")``), and the reallocations': a role's weights (``model_bytes``) over ``bandwidth``
    bytes per second, plus ``latency`` seconds each; ``contention``: how many times longer a task
    takes while every other worker is busy too (1: workers never slow each other down)."""

    calls: dict[tuple[str, str], float]
    model_bytes: dict[str, float] = dataclasses.field(default_factory=dict)
    bandwidth: float = 1e9
    latency: float = 0.0
    contention: float = 1.0

    def call(self, mfc: str, placement: Placement) -> float:
        key = (mfc, str(placement.layout))
        if key not in self.calls:
            raise MissingCost(f"no cost for {mfc!r} in layout {placement.layout}: profile it first")
        return self.calls[key]

    def realloc(self, role: str, home: Placement, copy: Placement) -> float:
        """The most any copy rank lacks of its tensor-parallel slice, over the bandwidth: each
        rank receives what its worker's home slice does not hold, and they receive at once. A
        worker outside home lacks its whole slice; one that stays in the same slice lacks
        nothing. (Slices are taken as even fractions of the weights; FSDP's shards are not
        modelled: a sharded home counts as holding its tensor-parallel slice.)"""
        held = {w: _slice(home, i) for i, w in enumerate(home.workers)}
        lacking = 0.0
        for i, w in enumerate(copy.workers):
            lo, hi = _slice(copy, i)
            have = held.get(w)
            overlap = max(0.0, min(hi, have[1]) - max(lo, have[0])) if have else 0.0
            lacking = max(lacking, hi - lo - overlap)
        if lacking <= 1e-12:
            return 0.0
        return self.latency + lacking * self.model_bytes.get(role, 0.0) / self.bandwidth


def _slice(placement: Placement, index: int) -> tuple[float, float]:
    """The fraction of the weights the ``index``-th worker of ``placement`` holds: its stage's
    share (stages taken as equal), and its tensor-parallel slice of that."""
    stage, _, tp_rank = placement.layout.coords(index)
    width = 1.0 / (placement.layout.pp * placement.layout.tp)
    start = (stage * placement.layout.tp + tp_rank) * width
    return start, start + width


@dataclasses.dataclass
class Simulation:
    """``step_seconds``: the mean time between steps once running (the first ``warmup`` left
    out); ``call_seconds``: each MFC's seconds per call (slowed by contention where it ran beside
    another); ``realloc_seconds``: reallocation per step; ``busy``: each worker's busy fraction over
    the steps measured; ``overlap``: the fraction of that time in which tasks on disjoint workers
    ran at once (what contention applies to)."""

    step_seconds: float
    call_seconds: dict[str, float]
    realloc_seconds: float
    busy: dict[int, float]
    overlap: float = 0.0


@dataclasses.dataclass(eq=False)
class _Task:
    workers: tuple[int, ...]
    seconds: float
    call: tuple[MFCDef, int] | None = None  # None: a reallocation
    start: float | None = None
    left: float = 0.0  # seconds of work still to do at full speed


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
    running: list[_Task] = []
    ran: list[tuple[float, float, _Task]] = []  # (start, end, task) of everything that ran
    overlapped: list[tuple[float, float]] = []  # spans in which disjoint workers ran tasks at once
    all_workers = {w for m in mfcs for w in config.call_placement(m.name).workers}
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
                head.start, head.left = now, head.seconds
                running.append(head)

    def speeds() -> list[float]:
        """Each running task's progress per second: slowed by the other workers busy beside it."""
        busy_workers = {w for t in running for w in t.workers}
        out = []
        for t in running:
            others = len(all_workers) - len(t.workers)
            share = len(busy_workers - set(t.workers)) / others if others else 0.0
            out.append(1.0 / (1.0 + (costs.contention - 1.0) * share))
        return out

    post_ready()
    start_ready()
    while running:
        rates = speeds()
        dt = min(t.left / r for t, r in zip(running, rates))
        if len({w for t in running for w in t.workers}) > max(len(t.workers) for t in running):
            overlapped.append((now, now + dt))
        now += dt
        for t, r in zip(running, rates):
            t.left -= dt * r
        ended = [t for t in running if t.left <= 1e-12]
        running[:] = [t for t in running if t.left > 1e-12]
        for task in ended:
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
            spent[t.call[0].name].append(b - a)
        for w in t.workers:
            busy[w] += inside(a, b)
        if t.call is None:
            moving += inside(a, b)
    return Simulation(
        step_seconds=span / (steps - warmup),
        call_seconds={name: statistics.mean(v) for name, v in spent.items()},
        realloc_seconds=moving / (steps - warmup),
        busy={w: busy[w] / span for w in sorted(busy)} if span > 0 else {},
        overlap=sum(inside(a, b) for a, b in overlapped) / span if span > 0 else 0.0,
    )
