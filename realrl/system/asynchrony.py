"""The asynchrony policy: everything asynchronous RL adds to the master, in one object.

Asynchronous RL (AReaL's design in ReaL's graph: "AReaL: A Large-Scale Asynchronous Reinforcement
Learning System for Language Reasoning") lets a generate call sample up to ``max_staleness``
versions behind the newest trained policy. The policy owns what that takes at run time:
- the bound and its consequences (``VersionRule``: which call may go, how far the loader reads
  ahead, which copies stay filled and receive pushed weights);
- partial rollouts: a generate call decoded in pieces, a newer version reaching the answers still
  being decoded between two pieces;
- the answers in flight at a recover point (``InflightAnswers``): kept by the point, read back on
  resume instead of generated again;
- its records: how stale the samples each training call trains on are (``async/staleness_*``)
  and how long generation and training waited for the master (``async/idle_s/<mfc>``).

A synchronous run holds ``SyncPolicy``, which does nothing but apply the parameter-version rule;
the master calls the same hooks either way and never asks whether the run is asynchronous.
"""

from __future__ import annotations

import time

from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig
from realrl.system.buffer import SampleBuffer
from realrl.system.copies import CopyTracker
from realrl.system.function_call import CallDispatcher, CallResult, PostedCall
from realrl.system.inflight import InflightAnswers
from realrl.system.progress import Progress
from realrl.system.protocol import Segment
from realrl.system.request_reply_stream import MasterStream
from realrl.system.step_log import StepLog
from realrl.system.version_rule import VersionRule

# the calls whose workers' idle time each step records (generation, training)
IDLE_TIMED = (ModelInterfaceType.GENERATE, ModelInterfaceType.TRAIN_STEP)


class SyncPolicy:
    """The synchronous run's policy: the parameter-version rule, and no hook does anything."""

    def __init__(self, config: ExperimentConfig):
        self.config = config
        self.rule = VersionRule(config)

    @property
    def live_steps(self) -> int:
        """Steps the loader may fetch ahead of the last finished one."""
        return self.rule.live_steps

    def ready(self, mfc: MFCDef, step: int, progress: Progress) -> bool:
        """Whether ``mfc``'s call at ``step`` may read (or change) its model's weights now."""
        return self.rule.ready(mfc, step, progress.calls_done, progress.calls_posted, progress.total_steps)

    def decodes_in_pieces(self, mfc: MFCDef) -> bool:
        return False

    def is_kept(self, mfc: MFCDef, step: int) -> bool:
        """Whether the recover point resumed from kept the answers of ``mfc``'s call at ``step``."""
        return False

    def resume_from(self, step: int) -> None:
        """The run resumes from the recover point after ``step`` steps."""

    def on_post(self, log: StepLog, mfc: MFCDef, step: int, behind_pending: bool) -> None:
        """``mfc``'s call at ``step`` is posted (``behind_pending``: queued behind its previous
        call, which its workers are still running)."""

    def after_call(
        self,
        log: StepLog,
        mfc: MFCDef,
        step: int,
        result: CallResult,
        copies: CopyTracker,
        steps_done: int,
        posted: PostedCall | None,
    ) -> None:
        """``mfc``'s call at ``step`` finished (``posted``: None for answers read back from a
        recover point)."""

    async def save_inflight(self, role: str, steps_done: int, progress: Progress) -> None:
        """What the recover point after ``steps_done`` steps must keep of ``role``'s generation."""


class AsyncPolicy(SyncPolicy):
    def __init__(self, config: ExperimentConfig, stream: MasterStream, buffer: SampleBuffer):
        super().__init__(config)
        self.inflight = InflightAnswers(config, stream, buffer)
        self.last_reply: dict[str, float] = {}  # MFC -> when its last call replied (idle times)
        # the generate calls whose answers recover points keep (dynamic sampling's run apart)
        sampling = config.sampling_mfcs()
        self.generate_calls = [
            m for m in config.mfcs if m.interface_type is ModelInterfaceType.GENERATE and m not in sampling
        ]

    def decodes_in_pieces(self, mfc: MFCDef) -> bool:
        return self.rule.pieces(mfc) is not None

    def is_kept(self, mfc: MFCDef, step: int) -> bool:
        return self.inflight.is_kept(mfc, step)

    def resume_from(self, step: int) -> None:
        self.inflight.resume_from(step)

    def on_post(self, log: StepLog, mfc: MFCDef, step: int, behind_pending: bool) -> None:
        if mfc.interface_type in IDLE_TIMED:  # behind a pending call: 0 s
            self._record_idle(log, mfc, step, None if behind_pending else self.last_reply.get(mfc.name))

    def _record_idle(self, log: StepLog, mfc: MFCDef, step: int, last_reply: float | None) -> None:
        """Seconds between ``mfc``'s previous reply and this call's posting, the time its workers
        waited for it (when they run nothing else in between): ``async/idle_s/<mfc>``."""
        idle = 0.0 if last_reply is None else max(0.0, time.monotonic() - last_reply)
        log.add(step, {f"async/idle_s/{mfc.name}": idle})

    def after_call(
        self,
        log: StepLog,
        mfc: MFCDef,
        step: int,
        result: CallResult,
        copies: CopyTracker,
        steps_done: int,
        posted: PostedCall | None,
    ) -> None:
        self.last_reply[mfc.name] = time.monotonic()
        if mfc.interface_type is ModelInterfaceType.GENERATE and posted is not None:
            version = copies.versions_used.get((mfc.name, step))
            self.inflight.remember(mfc, step, posted, result, version, steps_done)
        if mfc.interface_type is ModelInterfaceType.TRAIN_STEP:
            # how many versions behind the training step's policy (version ``step``) its samples were drawn
            lags = [step - v for v in self.rule.sampled_versions(mfc, step, copies.versions_used)]
            if lags:
                log.add(
                    step,
                    {"async/staleness_max": float(max(lags)), "async/staleness_mean": sum(lags) / len(lags)},
                )

    async def save_inflight(self, role: str, steps_done: int, progress: Progress) -> None:
        """The answers of the generate calls of ``role`` at steps ``steps_done`` ..
        ``steps_done + max_staleness - 1`` go into the recover point of ``steps_done``. They were
        drawn from weights older than the point's (version k - max_staleness for step k), which a
        resumed run could not draw again; with them it trains on exactly the samples the
        uninterrupted run would have. Their calls are all posted by now (``VersionRule.ready``);
        this waits for them to finish."""
        upto = min(steps_done + self.rule.max_staleness, progress.total_steps)
        for m in [m for m in self.generate_calls if m.role == role]:
            await progress.wait_for(lambda m=m: progress.calls_done[m.name] >= upto)
            for k in range(steps_done, upto):
                await self.inflight.save(m, k, steps_done)

    async def restore(
        self, mfc: MFCDef, step: int, ids: list, copies: CopyTracker, progress: Progress
    ) -> CallResult:
        """A generate call whose answers the resumed recover point kept: they are read back, and
        the call counts as posted, with its saved report and version."""
        result, version = await self.inflight.restore(mfc, step, ids)
        copies.versions_used[(mfc.name, step)] = version
        progress.posted(mfc.name, step)
        return result

    async def generate_in_pieces(
        self,
        mfc: MFCDef,
        step: int,
        ids: list,
        calls: CallDispatcher,
        copies: CopyTracker,
        progress: Progress,
        log: StepLog,
    ) -> tuple[PostedCall, CallResult]:
        """A generate call decoded ``async_rl.interrupt_every`` tokens at a time (partial
        rollouts): between two pieces, a policy version its model finished in the meantime
        reaches the copy the call runs on (at home the worker has run the training call itself),
        and the unfinished answers continue under it. Every piece's reallocation is in the step's
        record; the call's statistics, outputs and bookkeeping are those of one call."""
        tokens = self.rule.pieces(mfc)
        replicas = self.config.call_placement(mfc.name).replicas()
        posted = calls.post(mfc, step, ids, replicas, copies.plan(mfc, step), Segment(0, tokens))
        progress.posted(mfc.name, step)
        self._record_idle(log, mfc, step, self.last_reply.get(mfc.name))
        result = await calls.finish(mfc, posted)
        index = 0
        while result.unfinished:
            log.realloc(step, mfc.role, result)
            index += 1
            done = (progress.calls_done[t] for t in self.rule.training_calls_of(mfc))
            finished = min(done, default=copies.versions[mfc.role])  # the model's finished versions
            copy = copies.plan_continue(mfc, finished)
            posted = calls.post(mfc, step, ids, replicas, copy, Segment(index, tokens))
            result = result.then(await calls.finish(mfc, posted))
        result.stats["pieces"] = float(index + 1)
        return posted, result


def asynchrony_policy(config: ExperimentConfig, stream: MasterStream, buffer: SampleBuffer) -> SyncPolicy:
    """The policy of ``config``'s run: asynchronous when ``config.async_rl`` is set."""
    if config.async_rl is None:
        return SyncPolicy(config)
    return AsyncPolicy(config, stream, buffer)
