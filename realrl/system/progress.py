"""The master's counters of a run: calls posted and finished per MFC, steps finished, and the
waits on them (the parameter-version rule, the loader's lead, a recover point's in-flight
answers). Every coroutine of the master waits here; whoever changes a counter notifies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Progress:
    def __init__(self, mfc_names: list[str]):
        self.calls_done = dict.fromkeys(mfc_names, 0)
        self.calls_posted = dict.fromkeys(mfc_names, 0)  # steps whose call is posted (or restored)
        self.steps_done = 0
        self.total_steps = 0
        self._waiters: list[asyncio.Future] = []

    def start_at(self, step: int) -> None:
        """A resumed run: every call of the first ``step`` steps counts as posted and done."""
        self.steps_done = step
        self.calls_done = dict.fromkeys(self.calls_done, step)
        self.calls_posted = dict.fromkeys(self.calls_posted, step)

    def posted(self, mfc_name: str, step: int) -> None:
        """``mfc``'s call at ``step`` is out: training calls waiting for it may go."""
        self.calls_posted[mfc_name] = step + 1
        self.notify()

    def steps_complete(self) -> list[int]:
        """Count every step whose calls are all done, in order; return them (0-based)."""
        out = []
        while self.steps_done < self.total_steps and all(
            n > self.steps_done for n in self.calls_done.values()
        ):
            out.append(self.steps_done)
            self.steps_done += 1
        return out

    def notify(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut
