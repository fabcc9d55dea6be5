"""The master worker: walks the MFC graph for the configured steps, holding metadata only.

It runs the graph and nothing else: one coroutine per MFC takes its batch from the sample buffer
as soon as its inputs are ready and the asynchrony policy lets it go, posts the call and, once it
is done, hands it to the parts in turn. The parts, each the one owner of its job:
- ``buffer`` (``SampleBuffer``): who holds which (sample id, key); frees go to the holders only;
- ``calls`` (``CallDispatcher``): posting a call and collecting its results;
- ``copies`` (``CopyTracker``): which copy of each model a call runs on, and its version;
- ``feed`` (``DataFeed``): fetching dataset batches, its position along the dataset;
- ``policy`` (``asynchrony``): the parameter-version rule and all of asynchronous RL;
- ``log`` (``StepLog``): the step records and their files;
- ``checkpoints`` (``Checkpointer``): HF checkpoints, recover points, resuming;
- ``evaluator`` (``Evaluator``) and ``subgraphs`` (``SubgraphExecutor``): evaluation and dynamic
  sampling, each a sub-graph on a private buffer;
- ``progress`` (``Progress``): the counters every coroutine waits on.
A guard coroutine turns a dead or silent worker into an error naming it. docs/runtime.md draws
the parts and walks one batch through them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from realrl.api.core.dfg import MFCDef
from realrl.api.core.model_api import FinetuneSpec
from realrl.api.core.system_api import ExperimentConfig, model_worker_name
from realrl.base import logging
from realrl.system.asynchrony import asynchrony_policy
from realrl.system.buffer import SampleBuffer
from realrl.system.checkpointer import Checkpointer
from realrl.system.copies import CopyTracker
from realrl.system.data_feed import Batch, DataFeed
from realrl.system.dynamic_sampling import DynamicSampler, merged_result
from realrl.system.evaluator import Evaluator
from realrl.system.function_call import (
    CallDispatcher,
    CallResult,
    FreeQueue,
    PostedCall,
    post_all,
    run_guarded,
)
from realrl.system.progress import Progress
from realrl.system.protocol import InitializeRequest, SetupRequest
from realrl.system.request_reply_stream import MasterStream, WorkerLostError
from realrl.system.schedule import Schedule
from realrl.system.step_log import StepLog
from realrl.system.subgraph import SubgraphExecutor
from realrl.system.transfer_plan import push_targets

logger = logging.getLogger("master_worker")


class MasterWorker:
    def __init__(
        self,
        config: ExperimentConfig,
        stream: MasterStream,
        check_workers: Callable[[], None] | None = None,
        on_step: Callable[[dict, int], None] | None = None,
    ):
        self.config, self.stream = config, stream
        self.check_workers = check_workers or (lambda: None)
        self.worker_names = [model_worker_name(w) for w in range(config.n_model_workers)]
        # with dynamic sampling, the sampling calls run in rounds on a buffer of their own; the
        # graph's buffer receives the samples the filter kept
        self.sampling = config.sampling_mfcs()
        self.buffer = SampleBuffer(m.name for m in config.mfcs if m not in self.sampling)
        self.progress = Progress([m.name for m in config.mfcs])
        # calls push their outputs to the workers reading them (transfer_plan): a busy producer
        # never holds a consumer's inputs behind its next call
        self.calls = CallDispatcher(
            self.buffer, stream, config.timeouts.request, push_targets=push_targets(config)
        )
        self.copies = CopyTracker(config, self.calls.tags)
        self.frees = FreeQueue(stream, config.timeouts.request)
        self.feed = DataFeed(config, stream)
        self.policy = asynchrony_policy(config, stream, self.buffer)
        self.log = StepLog(config.run_dir, on_step)
        self.checkpoints = Checkpointer(config, stream, self.progress, self.feed, self.policy)
        self.subgraphs = SubgraphExecutor(config, stream, self.calls.tags, self.copies)
        self.evaluator = Evaluator(config, stream, self.feed, self.subgraphs, self.log)
        self.start_step = 0  # > 0 when resuming from a recover point

    @property
    def total_steps(self) -> int:
        return self.progress.total_steps

    # -- the run ---------------------------------------------------------------------------------

    async def run(self) -> list[dict]:
        self.stream.start()
        cfg = self.config
        loop = asyncio.get_running_loop()
        guard = loop.create_task(self._guard())
        try:
            await run_guarded([loop.create_task(self._setup())], guard)
            guard = loop.create_task(self._guard())
            source = self._sample_steps() if self.sampling else self._load_steps()
            work = [loop.create_task(source)]
            work += [loop.create_task(self._run_calls(m)) for m in cfg.mfcs if m not in self.sampling]
            # a worker failing because its peer vanished: wait for the guard (heartbeats, the
            # launcher) to name the peer, the root cause
            await run_guarded(work, guard, grace=cfg.timeouts.heartbeat + 5.0)
            await self.frees.drain()
        finally:
            if not guard.done():
                guard.cancel()
        logger.info(
            "experiment %s/%s finished %d steps", cfg.experiment_name, cfg.trial_name, self.total_steps
        )
        return self.log.stats

    async def _setup(self) -> None:
        cfg, t = self.config, self.config.timeouts
        await self.stream.wait_hello(self.worker_names, t.connect, check=self.check_workers)
        logger.info("all %d model workers connected", len(self.worker_names))
        workers = range(cfg.n_model_workers)
        setup = SetupRequest(cfg.mesh_placements(), cfg.realloc_groups())
        replies = await post_all(self.stream, dict.fromkeys(workers, setup), "setup", t.setup)
        sizes = [replies[w].dataset_size for w in self.feed.owners]
        self.feed.set_sizes(sizes)
        total = cfg.total_train_epochs * self.feed.steps_per_epoch
        self.progress.total_steps = min(total, cfg.total_train_steps or total)
        ft_spec = FinetuneSpec(cfg.total_train_epochs, sum(sizes), cfg.batch_size)
        replies = await post_all(
            self.stream, dict.fromkeys(workers, InitializeRequest(ft_spec)), "initialize", t.setup
        )
        schedule = Schedule(
            self.total_steps,
            cfg.eval_freq_steps,
            cfg.save_freq_steps,
            cfg.ckpt_freq_steps,
            evaluates=bool(cfg.eval_datasets) or cfg.eval_prompts is not None,
            trains=bool(self.checkpoints.trained),
        )
        self.checkpoints.start(schedule, {n for r in replies.values() if r is not None for n in r.stateful})
        if cfg.resume:
            await self._resume()
        self.log.keep_until(self.start_step)
        logger.info(
            "setup done: %d samples, %d steps/epoch, %d steps",
            sum(sizes),
            self.feed.steps_per_epoch,
            self.total_steps,
        )

    async def _resume(self) -> None:
        """Every part continues from the recover point: the workers' models and states (loaded by
        the checkpointer), the counters, the copies' versions, the feed's position, the answers
        the point kept."""
        point = await self.checkpoints.resume()
        if point is None:
            return
        step, counters = point
        self.start_step = min(step, self.total_steps)
        self.progress.start_at(self.start_step)
        self.copies.start_at(self.start_step)
        self.feed.start_at(self.start_step, counters.get("feed"))
        self.policy.resume_from(step)

    async def _guard(self) -> None:
        """Raise as soon as the launcher reports a dead worker or one stops heartbeating, saying
        what the worker was doing."""
        t = self.config.timeouts
        while True:
            try:
                self.check_workers()
                silent = self.stream.silent_workers(self.worker_names, t.heartbeat)
                if silent:
                    w, s = silent[0]
                    raise WorkerLostError(w, f"no heartbeat for {s:.1f} s (limit {t.heartbeat} s)")
            except WorkerLostError as e:
                self.stream.drain()  # replies it sent before it was lost: not what it was doing
                doing = self.stream.in_flight(e.worker)
                if doing:
                    raise WorkerLostError(e.worker, f"{e.reason}, while running {doing[0]}") from None
                last = self.stream.finished_last(e.worker)
                if last is None:
                    raise
                raise WorkerLostError(e.worker, f"{e.reason}, between requests (its last: {last})") from None
            await asyncio.sleep(0.2)

    # -- where each step's batch comes from ------------------------------------------------------

    async def _load_steps(self) -> None:
        """One dataset batch per step, fetched ahead by the feed, into the graph's buffer."""

        def add(step: int, epoch: int, batch: Batch) -> None:
            for owner, meta in batch:
                self.buffer.add(meta, owner=owner, step=step)
            self.log.open(step, epoch)

        await self.feed.load(self.progress, self.policy.live_steps, self.start_step, add)

    async def _sample_steps(self) -> None:
        """Dynamic sampling: each step's sampling calls in rounds until their filter has kept a
        full batch (``dynamic_sampling``), which then joins the graph's buffer. In place of the
        dataset loader and of those calls' own coroutines."""
        mfcs, progress = self.sampling, self.progress
        sampler = DynamicSampler(self.config, self.feed, self.subgraphs)
        for step in range(self.start_step, self.total_steps):
            await progress.wait_for(
                lambda s=step: (
                    s - progress.steps_done < self.policy.live_steps
                    and all(self.policy.ready(m, s, progress) for m in mfcs)
                )
            )
            sampled = await sampler.sample(step)
            for m in mfcs:
                progress.posted(m.name, step)
            self.log.open(step, sampled.epoch)
            self.log.add(step, sampled.stats(sampler.prompt_batches))
            for m in mfcs:
                for result in sampled.results[m.name]:
                    self.log.realloc(step, m.role, result)
                self.log.call(step, m, merged_result(sampled.results[m.name]))
            self.frees.post(sampled.buffer.holders(sampled.freed))
            sampled.buffer.move_to(self.buffer, sampled.kept)
            await self.frees.reap()
            for m in mfcs:
                await self.checkpoints.after_call(m, step)  # a frozen role's state (they never train)
                progress.calls_done[m.name] += 1
            self._finish_steps()

    # -- the calls -------------------------------------------------------------------------------

    async def _run_calls(self, mfc: MFCDef) -> None:
        """``mfc``'s calls, step after step. When the next step's inputs are already in the buffer
        (a dataset batch the loader fetched ahead), that call is posted before the current one has
        replied: a worker runs its requests in order, so it goes straight from one call to the
        next instead of idling through the master's round trip. Never across an evaluation or a
        checkpoint, which must see the model between the two steps, and never while waiting:
        before any wait, the pending call is finished (its outputs may be what is waited for)."""
        replicas = self.config.call_placement(mfc.name).replicas()
        pending: tuple[int, PostedCall] | None = None
        for step in range(self.start_step, self.total_steps):
            if self.policy.is_kept(mfc, step):  # answers a recover point kept: no generation
                if pending is not None:
                    await self._finish(mfc, *pending)
                    pending = None
                ids = await self.buffer.take(mfc.name, mfc.input_keys, mfc.n_seqs)
                result = await self.policy.restore(mfc, step, ids, self.copies, self.progress)
                await self._call_done(mfc, step, result, None)
                continue
            ids = self._ready_inputs(mfc, step)
            boundary = pending is not None and self.checkpoints.boundary_after(mfc, pending[0])
            if pending is not None and ids is None and not boundary:
                ids = await self._inputs_before_reply(mfc, step, pending[1])
            if pending is not None and (ids is None or boundary):
                await self._finish(mfc, *pending)
                pending = None
            if ids is None:
                await self.progress.wait_for(lambda s=step: self.policy.ready(mfc, s, self.progress))
                ids = await self.buffer.take(mfc.name, mfc.input_keys, mfc.n_seqs)
            if self.policy.decodes_in_pieces(mfc):
                posted, result = await self.policy.generate_in_pieces(
                    mfc, step, ids, self.calls, self.copies, self.progress, self.log
                )
                await self._call_done(mfc, step, result, posted)
                continue
            copy = self.copies.plan(mfc, step)
            pushes = self.copies.weight_pushes(mfc, self.total_steps)
            posted = self.calls.post(mfc, step, ids, replicas, copy, push_weights=pushes)
            self.progress.posted(mfc.name, step)
            self.policy.on_post(self.log, mfc, step, behind_pending=pending is not None)
            if pending is not None:
                await self._finish(mfc, *pending)
            pending = (step, posted)
        if pending is not None:
            await self._finish(mfc, *pending)

    def _ready_inputs(self, mfc: MFCDef, step: int) -> list | None:
        """The ids of ``mfc``'s call at ``step`` if it could be posted now without waiting (the
        policy lets it go and its inputs are in the buffer), else None."""
        if not self.policy.ready(mfc, step, self.progress):
            return None
        return self.buffer.take_ready(mfc.name, mfc.input_keys, mfc.n_seqs)

    async def _inputs_before_reply(self, mfc: MFCDef, step: int, pending: PostedCall) -> list | None:
        """The ids of ``mfc``'s call at ``step`` if its inputs arrive before ``pending`` replies, else
        None. A worker answers a fetch queued behind the call it runs as soon as that call ends,
        so the batch often lands a moment after the previous call's reply: waiting for either
        keeps the next call queued behind the running one, whatever order the replies come in."""
        replies = list(pending.futures.values())
        while not all(f.done() for f in replies):
            ids = self._ready_inputs(mfc, step)
            if ids is not None:
                return ids
            # the replies still awaited only: one already in (a worker that only sent data) would
            # end every wait at once, and this loop would spin the master's CPU until the last
            waiting = [f for f in replies if not f.done()]
            await asyncio.wait([self.buffer.next_change(), *waiting], return_when=asyncio.FIRST_COMPLETED)
        return None

    async def _finish(self, mfc: MFCDef, step: int, posted: PostedCall) -> None:
        await self._call_done(mfc, step, await self.calls.finish(mfc, posted), posted)

    async def _call_done(self, mfc: MFCDef, step: int, result: CallResult, posted: PostedCall | None) -> None:
        """Everything that follows a finished call, in order: evaluation and checkpoints of a
        trained model, frees of the samples every call is done with (not waited for), the
        step's record, the policy's bookkeeping, the counters."""
        if self.checkpoints.trains(mfc):
            await self.evaluator.after_training(mfc, step, self.checkpoints.schedule)
        await self.checkpoints.after_call(mfc, step)
        self.frees.post(self.buffer.release(mfc.name, result.ids))
        await self.frees.reap()
        self.log.call(step, mfc, result)
        self.policy.after_call(self.log, mfc, step, result, self.copies, self.progress.steps_done, posted)
        self.progress.calls_done[mfc.name] += 1
        self._finish_steps()

    def _finish_steps(self) -> None:
        """Write the record of every step whose calls are all done, mark the recover points they
        complete, and wake the coroutines waiting on the counters."""
        for step in self.progress.steps_complete():
            self.log.write(step, self.total_steps)
        self.checkpoints.mark()
        self.progress.notify()

    # -- shutdown ----------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Ask every worker to exit; a worker that does not answer is left to the launcher."""
        futures = []
        for name in self.worker_names:
            try:
                futures.append(self.stream.post(name, "exit"))
            except WorkerLostError:
                continue
        if futures:
            await asyncio.wait(futures, timeout=self.config.timeouts.shutdown)
        for f in futures:
            if f.done() and not f.cancelled():
                f.exception()
