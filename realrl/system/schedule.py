"""When a run evaluates, saves HF checkpoints and writes recover points: one rule for each, read
by every part of the master that has to know (what follows a training call, and whether the next
call may be posted before the current one replies)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Schedule:
    total_steps: int
    eval_freq: int | None = None
    save_freq: int | None = None
    ckpt_freq: int | None = None
    evaluates: bool = False  # there are evaluation sets
    trains: bool = False  # a model trains (else there is nothing to resume)

    def eval_due(self, steps_done: int) -> bool:
        """Evaluate after ``steps_done`` steps: every ``eval_freq`` steps and at the end."""
        return self.evaluates and (steps_done == self.total_steps or _every(self.eval_freq, steps_done))

    def save_due(self, steps_done: int) -> bool:
        """An HF checkpoint after ``steps_done`` steps: every ``save_freq`` steps and the final one."""
        return steps_done == self.total_steps or _every(self.save_freq, steps_done)

    def recover_due(self, steps_done: int) -> bool:
        """A recover point after ``steps_done`` steps: every ``ckpt_freq`` steps and at the end,
        when a model trains and recover points are asked for."""
        return (
            self.trains
            and bool(self.ckpt_freq)
            and (_every(self.ckpt_freq, steps_done) or steps_done == self.total_steps)
        )

    def any_due(self, steps_done: int) -> bool:
        return self.eval_due(steps_done) or self.save_due(steps_done) or self.recover_due(steps_done)


def _every(freq: int | None, steps_done: int) -> bool:
    return bool(freq) and steps_done % freq == 0
