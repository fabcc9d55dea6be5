"""Failpoints: a worker that kills or stops itself at a named point of its work, so the fault
tests can put a failure exactly where they mean to (the idea of FreeBSD's and etcd's failpoints).

``ExperimentConfig.failpoints`` lists them as ``"<worker>:<point>[@<step>][:stop]"``:
``"1:train@2"`` SIGKILLs model worker 1 as it starts a training call of step 2 (0-based),
``"0:transfer:stop"`` SIGSTOPs worker 0 (a hang) at its first data transfer. An empty list, the
default, costs one truth test per point.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import time

POINTS = ("setup", "initialize", "fetch", "transfer", "realloc", "generate", "inference", "train", "save")
ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
FLUSH_S = 0.2
_SPEC = re.compile(r"^(?P<worker>\d+):(?P<point>[a-z]+)(?:@(?P<step>\d+))?(?::(?P<action>kill|stop))?$")


@dataclasses.dataclass(frozen=True)
class Failpoint:
    worker: int
    point: str
    step: int | None = None  # None: the first time the point is reached
    action: str = "kill"

    @classmethod
    def parse(cls, text: str) -> Failpoint:
        m = _SPEC.match(text.strip())
        if not m or m.group("point") not in POINTS:
            raise ValueError(
                f"failpoint {text!r} is not '<worker>:<point>[@<step>][:stop]' with a point among {list(POINTS)}"
            )
        step = m.group("step")
        return cls(
            int(m.group("worker")),
            m.group("point"),
            None if step is None else int(step),
            m.group("action") or "kill",
        )


class Failpoints:
    """The failpoints of one worker."""

    def __init__(self, specs: list[str], worker: int):
        self.mine = [fp for fp in map(Failpoint.parse, specs) if fp.worker == worker]

    def hit(self, point: str, step: int | None = None) -> None:
        for fp in self.mine:
            if fp.point == point and (fp.step is None or fp.step == step):
                # the replies to earlier requests leave first (ZMQ sends from a thread of its
                # own), as they would have long before a real failure in the middle of a call
                time.sleep(FLUSH_S)
                os.kill(os.getpid(), ACTIONS[fp.action])
