"""The checkpoint manager: when, what and where a run saves, and how a resumed run starts.

When: the ``Schedule`` (HF checkpoints every ``save_freq_steps`` and at the end, recover points
every ``ckpt_freq_steps`` and at the end). What: after a trained role's training call, its HF
checkpoint and its part of the recover point; after a frozen role's stateful call (the reward
normalisation), that state; the answers in flight (the asynchrony policy's); and, once every part
is on disk, the master's own counters (the data feed's position). Where: ``checkpointing``'s
layout. A point is marked complete only when its steps' records are written, so a run killed
between a checkpoint and its record resumes from the point before and loses no record.
"""

from __future__ import annotations

from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import ExperimentConfig
from realrl.base import logging
from realrl.impl.model.backend.integrity import write_json_atomic
from realrl.system import checkpointing
from realrl.system.asynchrony import SyncPolicy
from realrl.system.data_feed import DataFeed
from realrl.system.function_call import post_all
from realrl.system.progress import Progress
from realrl.system.protocol import LoadRecoverRequest, SaveRequest
from realrl.system.request_reply_stream import MasterStream
from realrl.system.schedule import Schedule

logger = logging.getLogger("master_worker")


class Checkpointer:
    def __init__(
        self,
        config: ExperimentConfig,
        stream: MasterStream,
        progress: Progress,
        feed: DataFeed,
        policy: SyncPolicy,
    ):
        self.config, self.stream, self.progress, self.feed, self.policy = (
            config,
            stream,
            progress,
            feed,
            policy,
        )
        self.trained = config.trained_roles()  # role -> its training MFC
        self.schedule = Schedule(0)
        # frozen roles' calls whose interfaces hold state (reward normalisation): in recover points too
        self.state_mfcs: list[MFCDef] = []
        self.saved: dict[int, set[str]] = {}  # step -> parts saved (trained roles' MFCs, state_mfcs)
        self.ready: list[int] = []  # every part saved, waiting for their steps' records

    def start(self, schedule: Schedule, stateful: set[str]) -> None:
        """The run's schedule, and the MFCs whose interfaces reported state (setup)."""
        self.schedule = schedule
        if self.trained:  # without a trained model there are no recover points
            self.state_mfcs = [
                m for m in self.config.mfcs if m.name in stateful and m.role not in self.trained
            ]

    def trains(self, mfc: MFCDef) -> bool:
        """Whether ``mfc`` is its role's training call."""
        return self.trained.get(mfc.role) == mfc.name

    def boundary_after(self, mfc: MFCDef, step: int) -> bool:
        """Whether an evaluation or a checkpoint of ``mfc``'s model (or interface state) follows
        its call at ``step``: the next call must not be posted before it."""
        if mfc in self.state_mfcs:
            return self.schedule.recover_due(step + 1)
        return self.trains(mfc) and self.schedule.any_due(step + 1)

    # -- saving ---------------------------------------------------------------------------------

    async def after_call(self, mfc: MFCDef, step: int) -> None:
        """What ``mfc``'s call at ``step`` leaves to save: a trained model's checkpoints (before
        that model's next call, so they hold exactly ``step + 1`` updates), a frozen role's state."""
        if self.trains(mfc):
            await self._save_model(mfc, step + 1)
        elif mfc in self.state_mfcs and self.schedule.recover_due(step + 1):
            await self._save_state(mfc, step + 1)

    async def _save_model(self, mfc: MFCDef, steps_done: int) -> None:
        cfg, role = self.config, mfc.role
        workers = cfg.allocations[role]
        if self.schedule.save_due(steps_done):
            last = steps_done == self.schedule.total_steps
            path = checkpointing.hf_dir(cfg.run_dir, role, None if last else steps_done)
            req = SaveRequest(role, "hf", path, mfc.name)  # a sharded model gathers on every rank
            await post_all(self.stream, dict.fromkeys(workers, req), "save", cfg.timeouts.request)
        if self.schedule.recover_due(steps_done):
            path = checkpointing.recover_dir(cfg.run_dir, steps_done, role)
            req = SaveRequest(role, "recover", path, mfc.name, steps_done)
            await post_all(self.stream, dict.fromkeys(workers, req), "save", cfg.timeouts.request)
            await self.policy.save_inflight(role, steps_done, self.progress)
            self._part_saved(steps_done, mfc.name)

    async def _save_state(self, mfc: MFCDef, steps_done: int) -> None:
        """A frozen role's interface state, on every worker that runs the call (each rank's file)."""
        requests = {
            w: SaveRequest(mfc.role, "state", path, mfc.name, steps_done)
            for m, w, path in self._state_files(steps_done)
            if m is mfc
        }
        await post_all(self.stream, requests, "save", self.config.timeouts.request)
        self._part_saved(steps_done, mfc.name)

    def _part_saved(self, steps_done: int, part: str) -> None:
        """Count ``part`` as saved in the point of ``steps_done``; with every part saved, the
        master's counters join it and the point waits for its records."""
        parts = {*self.trained.values(), *(m.name for m in self.state_mfcs)}
        saved = self.saved.setdefault(steps_done, set())
        saved.add(part)
        if saved == parts:
            del self.saved[steps_done]
            counters = {"feed": self.feed.state(steps_done)}
            write_json_atomic(checkpointing.master_state_file(self.config.run_dir, steps_done), counters)
            self.ready.append(steps_done)
            self.mark()

    def mark(self) -> None:
        """Mark the newest complete recover point whose steps all have their record."""
        ready = [s for s in self.ready if s <= self.progress.steps_done]
        if ready:
            checkpointing.mark_recover_point(self.config.run_dir, max(ready))
            self.ready = [s for s in self.ready if s > max(ready)]

    def _state_files(self, step: int) -> list[tuple[MFCDef, int, str]]:
        """(MFC, worker, file) of every frozen role's state in the recover point of ``step``: one
        file per rank of the call's placement."""
        cfg = self.config
        return [
            (mfc, w, checkpointing.state_file(cfg.run_dir, step, mfc.role, mfc.name, rank))
            for mfc in self.state_mfcs
            for rank, w in enumerate(cfg.call_placement(mfc.name).workers)
        ]

    # -- resuming -------------------------------------------------------------------------------

    async def resume(self) -> tuple[int, dict] | None:
        """Load the newest recover point that verifies into the workers; newer ones (unmarked or
        damaged) are discarded, each named in the log, so the steps they held are run again.
        The point's step and the master's counters it kept; None without a point."""
        cfg = self.config
        choice = checkpointing.choose_recover_point(cfg.run_dir, self._check_parts)
        for problem in choice.skipped:
            logger.error("skipping a recover point: %s", problem)
        step = choice.step
        for newer in checkpointing.discard_after(cfg.run_dir, step or 0):
            logger.warning("discarded the recover point of step %d (not complete or not readable)", newer)
        if step is None:
            logger.info("resume asked but %s holds no recover point: starting from step 0", cfg.run_dir)
            return None
        paths = {role: checkpointing.recover_dir(cfg.run_dir, step, role) for role in self.trained}
        requests: dict[int, LoadRecoverRequest] = {}
        for w in sorted({w for role in self.trained for w in cfg.allocations[role]}):
            requests[w] = LoadRecoverRequest(paths, step=step)
        for mfc, w, path in self._state_files(step):
            requests.setdefault(w, LoadRecoverRequest({}, step=step)).states[mfc.name] = path
        await post_all(self.stream, requests, "load_recover", cfg.timeouts.setup)
        logger.info("resumed from the recover point after step %d", step)
        return step, checkpointing.read_master_state(cfg.run_dir, step)

    def _check_parts(self, step: int) -> None:
        """Refuse a recover point that lacks a model or a state this run needs."""
        files = [path for *_, path in self._state_files(step)]
        checkpointing.require_parts(self.config.run_dir, step, sorted(self.trained), files)
