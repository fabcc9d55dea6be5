"""The master worker: walks the MFC graph for the configured steps, holding metadata only.

One coroutine per MFC takes its batch from the buffer as soon as its input keys are ready; a
loader coroutine fetches dataset batches (at most two steps live at once); a guard coroutine
turns a dead or silent worker into an error naming it. Parameter-version rule (docs/runtime.md): a
non-training call of a model at step k waits until every training call of that model finished
step k - 1, so the next ``actor_gen`` samples from the policy ``actor_train`` just updated.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable

from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.model_api import SAMPLES_KEY, FinetuneSpec
from realrl.api.core.system_api import ExperimentConfig, model_worker_name
from realrl.base import logging
from realrl.system import checkpointing
from realrl.system.buffer import SampleBuffer
from realrl.system.copies import CopyTracker
from realrl.system.dynamic_sampling import DynamicSampler, merged_result
from realrl.system.function_call import CallDispatcher, CallResult, PostedCall, post_all, run_guarded
from realrl.system.inflight import InflightAnswers
from realrl.system.protocol import (
    EvaluateRequest,
    FetchEvalRequest,
    FetchRequest,
    InitializeRequest,
    LoadRecoverRequest,
    SaveRequest,
    Segment,
    SetupRequest,
)
from realrl.system.request_reply_stream import MasterStream, WorkerLostError, wait_replies
from realrl.system.schedule import Schedule
from realrl.system.step_records import brief, record_call, record_idle, record_realloc, record_staleness
from realrl.system.transfer_plan import push_targets
from realrl.system.version_rule import VersionRule

logger = logging.getLogger("master_worker")

# asynchronous RL: the calls whose workers' idle time each step records (generation, training)
IDLE_TIMED = (ModelInterfaceType.GENERATE, ModelInterfaceType.TRAIN_STEP)


class Progress:
    """Counters the coroutines wait on: calls finished per MFC, steps finished."""

    def __init__(self, mfc_names: list[str]):
        self.calls_done = dict.fromkeys(mfc_names, 0)
        self.calls_posted = dict.fromkeys(mfc_names, 0)  # steps whose call is posted (or restored)
        self.steps_done = 0
        self._waiters: list[asyncio.Future] = []

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


class MasterWorker:
    def __init__(
        self,
        config: ExperimentConfig,
        stream: MasterStream,
        check_workers: Callable[[], None] | None = None,
        on_step: Callable[[dict, int], None] | None = None,
    ):
        self.config = config
        self.on_step = on_step or (lambda record, total_steps: None)  # progress bars, TensorBoard
        self.stream = stream
        self.check_workers = check_workers or (lambda: None)
        self.workers = list(range(config.n_model_workers))
        self.worker_names = [model_worker_name(w) for w in self.workers]
        # with dynamic sampling, the sampling calls run in rounds on a buffer of their own; the
        # graph's buffer receives the samples the filter kept
        self.sampling = config.sampling_mfcs()
        self.buffer = SampleBuffer(m.name for m in config.mfcs if m not in self.sampling)
        self.progress = Progress([m.name for m in config.mfcs])
        # calls push their outputs to the workers reading them (transfer_plan): a busy producer
        # never holds a consumer's inputs behind its next call
        pushes = push_targets(config)
        self.calls = CallDispatcher(self.buffer, stream, config.timeouts.request, push_targets=pushes)
        self.copies = CopyTracker(config, self.calls.tags)
        self.versions = VersionRule(config)
        self.last_reply: dict[str, float] = {}  # MFC -> when its last call replied (idle times)
        self.records: dict[int, dict] = {}
        self.stats: list[dict] = []  # one finished record per step, in order
        self.total_steps = 0
        self.steps_per_epoch = 0
        self.start_step = 0  # > 0 when resuming from a recover point
        self.trained = config.trained_roles()
        # frozen roles' calls whose interfaces hold state (reward normalisation): in recover points too
        self.state_mfcs: list[MFCDef] = []
        self.recover_saved: dict[int, set[str]] = {}  # step -> parts saved (trained roles' MFCs, state_mfcs)
        self.recover_ready: list[int] = []  # every part saved, waiting for their steps' records
        # asynchronous RL: answers drawn from weights older than a recover point's, kept by it
        self.inflight = InflightAnswers(config, stream, self.buffer)
        self.stats_path = os.path.join(config.run_dir, "stats.jsonl")
        # a few decoded prompts, completions and rewards per step, one line per step
        self.samples_path = os.path.join(config.run_dir, "samples.jsonl")

    # -- the run ---------------------------------------------------------------------------------

    async def run(self) -> list[dict]:
        self.stream.start()
        cfg = self.config
        guard = asyncio.get_running_loop().create_task(self._guard())
        try:
            setup = asyncio.get_running_loop().create_task(self._setup())
            await run_guarded([setup], guard)
            guard = asyncio.get_running_loop().create_task(self._guard())
            source = self._sample_dynamically() if self.sampling else self._load_data()
            work = [asyncio.get_running_loop().create_task(source)]
            work += [
                asyncio.get_running_loop().create_task(self._run_mfc(m))
                for m in cfg.mfcs
                if m not in self.sampling
            ]
            # a worker failing because its peer vanished: wait for the guard (heartbeats, the
            # launcher) to name the peer, the root cause
            await run_guarded(work, guard, grace=cfg.timeouts.heartbeat + 5.0)
        finally:
            if not guard.done():
                guard.cancel()
        logger.info(
            "experiment %s/%s finished %d steps", cfg.experiment_name, cfg.trial_name, self.total_steps
        )
        return self.stats

    async def _setup(self) -> None:
        cfg, t = self.config, self.config.timeouts
        await self.stream.wait_hello(self.worker_names, t.connect, check=self.check_workers)
        logger.info("all %d model workers connected", len(self.workers))
        replies = await post_all(
            self.stream,
            dict.fromkeys(self.workers, SetupRequest(cfg.mesh_placements(), cfg.realloc_groups())),
            "setup",
            t.setup,
        )
        owners = cfg.data_workers()
        per_rank = self._per_rank_counts(len(owners))
        sizes = [replies[w].dataset_size for w in owners]
        self.steps_per_epoch = min(s // n for s, n in zip(sizes, per_rank))
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"dataset shards have {sizes} samples but each step takes {per_rank} from them "
                f"(n_seqs={cfg.batch_size}); use a larger dataset or a smaller n_seqs"
            )
        self.total_steps = cfg.total_train_epochs * self.steps_per_epoch
        if cfg.total_train_steps is not None:
            self.total_steps = min(self.total_steps, cfg.total_train_steps)
        ft_spec = FinetuneSpec(cfg.total_train_epochs, sum(sizes), cfg.batch_size)
        replies = await post_all(
            self.stream, dict.fromkeys(self.workers, InitializeRequest(ft_spec)), "initialize", t.setup
        )
        if self.trained:  # without a trained model there are no recover points
            stateful = {n for r in replies.values() if r is not None for n in r.stateful}
            self.state_mfcs = [m for m in cfg.mfcs if m.name in stateful and m.role not in self.trained]
        if cfg.resume:
            await self._resume()
        self._trim_stats()
        logger.info(
            "setup done: %d samples, %d steps/epoch, %d steps",
            sum(sizes),
            self.steps_per_epoch,
            self.total_steps,
        )

    async def _resume(self) -> None:
        """Load the newest recover point that verifies; newer ones (unmarked or damaged) are
        discarded, each named in the log, so the steps they held are run again."""
        cfg = self.config
        choice = checkpointing.choose_recover_point(cfg.run_dir, self._check_recover_parts)
        for problem in choice.skipped:
            logger.error("skipping a recover point: %s", problem)
        step = choice.step
        for newer in checkpointing.discard_after(cfg.run_dir, step or 0):
            logger.warning("discarded the recover point of step %d (not complete or not readable)", newer)
        if step is None:
            logger.info("resume asked but %s holds no recover point: starting from step 0", cfg.run_dir)
            return
        paths = {role: checkpointing.recover_dir(cfg.run_dir, step, role) for role in self.trained}
        requests: dict[int, LoadRecoverRequest] = {}
        for w in sorted({w for role in self.trained for w in cfg.allocations[role]}):
            requests[w] = LoadRecoverRequest(paths, step=step)
        for mfc, w, path in self._state_files(step):
            requests.setdefault(w, LoadRecoverRequest({}, step=step)).states[mfc.name] = path
        await post_all(self.stream, requests, "load_recover", cfg.timeouts.setup)
        self.start_step = min(step, self.total_steps)
        self.copies = CopyTracker(cfg, self.calls.tags, start_version=self.start_step)
        if cfg.async_rl is not None:
            self.inflight.resume_from(step)
        self.progress.steps_done = self.start_step
        self.progress.calls_done = dict.fromkeys(self.progress.calls_done, self.start_step)
        self.progress.calls_posted = dict.fromkeys(self.progress.calls_posted, self.start_step)
        logger.info("resumed from the recover point after step %d", step)

    def _state_files(self, step: int) -> list[tuple[MFCDef, int, str]]:
        """(MFC, worker, file) of every frozen role's state in the recover point of ``step``: one
        file per rank of the call's placement."""
        out = []
        for mfc in self.state_mfcs:
            for rank, w in enumerate(self.config.call_placement(mfc.name).workers):
                out.append(
                    (mfc, w, checkpointing.state_file(self.config.run_dir, step, mfc.role, mfc.name, rank))
                )
        return out

    def _check_recover_parts(self, step: int) -> None:
        """Refuse a recover point that lacks a model or a state this run needs."""
        files = [path for *_, path in self._state_files(step)]
        checkpointing.require_parts(self.config.run_dir, step, sorted(self.trained), files)

    def _trim_stats(self) -> None:
        """Keep the records (and samples) of the steps already done: a resumed run continues the
        files."""
        for path in (self.stats_path, self.samples_path):
            kept = []
            if self.start_step and os.path.exists(path):
                with open(path) as f:
                    kept = [
                        line for line in f if line.strip() and json.loads(line)["step"] <= self.start_step
                    ]
            if kept or path == self.stats_path:
                with open(path, "w") as f:
                    f.writelines(kept)
            elif os.path.exists(path):
                os.remove(path)

    def _per_rank_counts(self, dp_size: int) -> list[int]:
        n = self.config.batch_size
        return [n // dp_size + (r < n % dp_size) for r in range(dp_size)]

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

    async def _load_data(self) -> None:
        """Post the dataset fetches up to ``live_steps`` ahead without waiting for each reply
        (a fetch waits in the data worker's queue behind the call it is running), and add the
        batches to the buffer in step order as their replies come (a failure of either half
        fails this task, and so the run)."""
        cfg = self.config
        owners = cfg.data_workers()
        counts = self._per_rank_counts(len(owners))
        fetches: asyncio.Queue = asyncio.Queue()

        async def post_fetches() -> None:
            for step in range(self.start_step, self.total_steps):
                await self.progress.wait_for(
                    lambda s=step: s - self.progress.steps_done < self.versions.live_steps
                )
                epoch, index = divmod(step, self.steps_per_epoch)
                futures = {
                    w: self.stream.post(
                        model_worker_name(w),
                        "fetch",
                        FetchRequest(n, step, epoch, index * n),
                        f"fetching the dataset batch of step {step}",
                    )
                    for w, n in zip(owners, counts)
                }
                fetches.put_nowait((step, futures))
            fetches.put_nowait(None)

        await asyncio.gather(post_fetches(), self._collect_batches(fetches, owners))

    async def _collect_batches(self, fetches: asyncio.Queue, owners: list[int]) -> None:
        while (item := await fetches.get()) is not None:
            step, futures = item
            replies = await wait_replies(futures, model_worker_name, "fetch", self.config.timeouts.request)
            for w in owners:
                self.buffer.add(replies[w].meta, owner=w, step=step)
            self.records[step] = {"step": step + 1, "epoch": replies[owners[0]].epoch + 1, "timing": {}}

    async def _run_mfc(self, mfc: MFCDef) -> None:
        """``mfc``'s calls, step after step. When the next step's inputs are already in the buffer
        (a dataset batch the loader fetched ahead), that call is posted before the current one has
        replied: a worker runs its requests in order, so it goes straight from one call to the
        next instead of idling through the master's round trip. Never across an evaluation or a
        checkpoint, which must see the model between the two steps, and never while waiting:
        before any wait, the pending call is finished (its outputs may be what is waited for)."""
        cfg = self.config
        replicas = cfg.call_placement(mfc.name).replicas()
        pending: tuple[int, PostedCall] | None = None
        pieces = self.versions.pieces(mfc)  # partial rollouts: tokens per piece of a generate call
        clears: list[dict] = []
        for step in range(self.start_step, self.total_steps):
            if self.inflight.is_kept(mfc, step):  # answers a recover point kept: no generation
                if pending is not None:
                    await self._finish(mfc, *pending, clears)
                    pending = None
                ids = await self.buffer.take(mfc.name, mfc.input_keys, mfc.n_seqs)
                await self._restore_generation(mfc, step, ids, clears)
                continue
            ids = self._ready_inputs(mfc, step)
            if pending is not None and ids is None and not self._boundary_after(mfc, pending[0]):
                ids = await self._inputs_before_reply(mfc, step, pending[1])
            if pending is not None and (ids is None or self._boundary_after(mfc, pending[0])):
                await self._finish(mfc, *pending, clears)
                pending = None
            if ids is None:
                await self.progress.wait_for(lambda s=step: self._ready(mfc, s))
                ids = await self.buffer.take(mfc.name, mfc.input_keys, mfc.n_seqs)
            if pieces is not None:
                await self._generate_in_pieces(mfc, step, ids, replicas, pieces, clears)
                continue
            copy = self.copies.plan(mfc, step)
            pushes = self.copies.weight_pushes(mfc, self.total_steps)
            posted = self.calls.post(mfc, step, ids, replicas, copy, push_weights=pushes)
            self._posted(mfc, step)
            if cfg.async_rl is not None and mfc.interface_type in IDLE_TIMED:  # behind a pending call: 0 s
                last = self.last_reply.get(mfc.name) if pending is None else None
                record_idle(self.records[step], mfc, last, time.monotonic())
            if pending is not None:
                await self._finish(mfc, *pending, clears)
            pending = (step, posted)
        if pending is not None:
            await self._finish(mfc, *pending, clears)
        for futures in clears:
            await wait_replies(futures, model_worker_name, "clear", cfg.timeouts.request)

    async def _generate_in_pieces(
        self,
        mfc: MFCDef,
        step: int,
        ids: list,
        replicas: list[list[int]],
        tokens: int,
        clears: list[dict],
    ) -> None:
        """A generate call decoded ``tokens`` at a time (partial rollouts): between two pieces, a
        policy version its model finished in the meantime reaches the copy the call runs on (at
        home the worker has run the training call itself), and the unfinished answers continue
        under it. Every piece's reallocation is in the step's record; the call's statistics,
        outputs and bookkeeping are those of one call."""
        record = self.records[step]
        posted = self.calls.post(mfc, step, ids, replicas, self.copies.plan(mfc, step), Segment(0, tokens))
        self._posted(mfc, step)
        record_idle(record, mfc, self.last_reply.get(mfc.name), time.monotonic())
        result = await self.calls.finish(mfc, posted)
        index = 0
        while result.unfinished:
            record_realloc(record, mfc.role, result)
            index += 1
            trains = self.versions.training_calls_of(mfc)
            done = (self.progress.calls_done[t] for t in trains)  # the model's finished versions
            finished = min(done, default=self.copies.versions[mfc.role])
            copy = self.copies.plan_continue(mfc, finished)
            posted = self.calls.post(mfc, step, ids, replicas, copy, Segment(index, tokens))
            result = result.then(await self.calls.finish(mfc, posted))
        result.stats["pieces"] = float(index + 1)
        self._remember_generation(mfc, step, posted, result)
        await self._after_call(mfc, step, result, clears)

    def _ready(self, mfc: MFCDef, step: int) -> bool:
        """The parameter-version rule for ``mfc``'s call at ``step`` (``VersionRule.ready``)."""
        p = self.progress
        return self.versions.ready(mfc, step, p.calls_done, p.calls_posted, self.total_steps)

    def _posted(self, mfc: MFCDef, step: int) -> None:
        """``mfc``'s call at ``step`` is out: training calls waiting for it may go."""
        self.progress.calls_posted[mfc.name] = step + 1
        self.progress.notify()

    def _ready_inputs(self, mfc: MFCDef, step: int) -> list | None:
        """The ids of ``mfc``'s call at ``step`` if it could be posted now without waiting (the
        version rule holds and its inputs are in the buffer), else None."""
        if not self._ready(mfc, step):
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

    @property
    def schedule(self) -> Schedule:
        cfg = self.config
        return Schedule(
            self.total_steps,
            cfg.eval_freq_steps,
            cfg.save_freq_steps,
            cfg.ckpt_freq_steps,
            evaluates=bool(cfg.eval_datasets) or cfg.eval_prompts is not None,
            trains=bool(self.trained),
        )

    def _boundary_after(self, mfc: MFCDef, step: int) -> bool:
        """Whether an evaluation or a checkpoint of ``mfc``'s model (or interface state) follows
        its call at ``step``."""
        if mfc in self.state_mfcs:
            return self.schedule.recover_due(step + 1)
        return self.trained.get(mfc.role) == mfc.name and self.schedule.any_due(step + 1)

    async def _finish(self, mfc: MFCDef, step: int, posted: PostedCall, clears: list[dict]) -> None:
        """Wait for the call's replies, then what follows it: evaluation and checkpoints of a
        trained model, freeing samples every MFC is done with (not waited for: the clear
        requests' replies are checked as they come and at the end), the step's record."""
        result = await self.calls.finish(mfc, posted)
        self._remember_generation(mfc, step, posted, result)
        await self._after_call(mfc, step, result, clears)

    def _remember_generation(self, mfc: MFCDef, step: int, posted: PostedCall, result: CallResult) -> None:
        """Keep what a recover point needs of an asynchronous generate call (``_save_inflight``)."""
        if self.config.async_rl is not None and mfc.interface_type is ModelInterfaceType.GENERATE:
            version = self.copies.versions_used.get((mfc.name, step))
            self.inflight.remember(mfc, step, posted, result, version, self.progress.steps_done)

    async def _after_call(self, mfc: MFCDef, step: int, result: CallResult, clears: list[dict]) -> None:
        """What follows a finished call (``_finish``)."""
        if self.trained.get(mfc.role) == mfc.name:
            await self._evaluate(mfc, step)
            await self._save(mfc, step + 1)
        elif mfc in self.state_mfcs and self.schedule.recover_due(step + 1):
            await self._save_state(mfc, step + 1)
        done = self.buffer.finish(mfc.name, result.ids)
        if done:
            clears.append({w: self.stream.post(model_worker_name(w), "clear", done) for w in self.workers})
        await self._reap_clears(clears)
        record_call(self.records[step], mfc, result)
        self.last_reply[mfc.name] = time.monotonic()
        if self.config.async_rl is not None and mfc.interface_type is ModelInterfaceType.TRAIN_STEP:
            record_staleness(
                self.records[step], step, self.versions.sampled_versions(mfc, step, self.copies.versions_used)
            )
        self.progress.calls_done[mfc.name] += 1
        self._maybe_finish_step(step)
        self.progress.notify()

    async def _sample_dynamically(self) -> None:
        """Dynamic sampling: each step's sampling calls in rounds until their filter has kept a
        full batch (``system/dynamic_sampling.py``), which then joins the graph's buffer. In place
        of the dataset loader and of those calls' own coroutines."""
        cfg, mfcs = self.config, self.sampling
        owners = cfg.data_workers()
        counts = self._per_rank_counts(len(owners))
        sampler = DynamicSampler(cfg, self.stream, self.calls.tags, self.copies, self._prompt_batches_done())
        clears: list[dict] = []
        for step in range(self.start_step, self.total_steps):
            await self.progress.wait_for(
                lambda s=step: (
                    s - self.progress.steps_done < self.versions.live_steps
                    and all(self._ready(m, s) for m in mfcs)
                )
            )
            sampled = await sampler.sample(step, self.steps_per_epoch, owners, counts)
            for m in mfcs:
                self._posted(m, step)
            record = {"step": step + 1, "epoch": sampled.epoch + 1, "timing": {}}
            record.update(sampled.stats(sampler.prompt_batches))
            self.records[step] = record
            for m in mfcs:
                for result in sampled.results[m.name]:
                    record_realloc(record, m.role, result)
                record_call(record, m, merged_result(sampled.results[m.name]))
            sampled.buffer.move_to(self.buffer, sampled.kept)
            if sampled.freed:
                clears.append(
                    {w: self.stream.post(model_worker_name(w), "clear", sampled.freed) for w in self.workers}
                )
            await self._reap_clears(clears)
            for m in mfcs:
                if m in self.state_mfcs and self.schedule.recover_due(step + 1):
                    await self._save_state(m, step + 1)
                self.progress.calls_done[m.name] += 1
            self._maybe_finish_step(step)
            self.progress.notify()
        for futures in clears:
            await wait_replies(futures, model_worker_name, "clear", cfg.timeouts.request)

    async def _reap_clears(self, clears: list[dict]) -> None:
        """Check the replies of the clear requests already answered, oldest first: a failed one
        is raised now, not at the end of the run."""
        while clears and all(f.done() for f in clears[0].values()):
            await wait_replies(clears.pop(0), model_worker_name, "clear", self.config.timeouts.request)

    def _prompt_batches_done(self) -> int:
        """Prompt batches a resumed run's earlier steps fetched (its last kept record says; one
        per step when it does not), so it continues where they stopped in the dataset."""
        if self.start_step == 0:
            return 0
        last = None
        if os.path.exists(self.stats_path):
            with open(self.stats_path) as f:
                lines = [line for line in f if line.strip()]
            last = json.loads(lines[-1]) if lines else None
        done = (last or {}).get("dynamic_sampling/prompt_batches")
        return int(done) if done is not None else self.start_step

    async def _evaluate(self, mfc: MFCDef, step: int) -> None:
        """Evaluate ``mfc``'s model on every dp rank's shard; the mean goes into this step's record."""
        cfg = self.config
        if not self.schedule.eval_due(step + 1):
            return
        if cfg.eval_prompts is not None:
            if mfc.role == self._mfc(cfg.eval_calls[0]).role:  # once, after the policy's update
                await self._evaluate_rollouts(step)
            return
        placement = cfg.placement(mfc.role)
        req = EvaluateRequest(mfc.role, mfc.name)
        replies = await post_all(
            self.stream, dict.fromkeys(placement.workers, req), "evaluate", cfg.timeouts.request
        )
        heads = [replies[w] for w in placement.heads()]  # a replica's tp ranks report the same
        keys = sorted({k for r in heads for k in r})
        record = self.records[step]
        for k in keys:
            values = [r[k] for r in heads if k in r]
            record[f"{mfc.name}/{k}"] = sum(values) / len(values)

    async def _evaluate_rollouts(self, step: int) -> None:
        """An RL run's evaluation after ``step``: the graph's ``eval_calls`` (generate, score,
        reference) and then the ``eval_mfcs`` on the held-out prompts, with their own buffer and
        ids; the statistics of the ``eval_mfcs`` go into this step's record as ``eval/<stat>``."""
        cfg = self.config
        owner = cfg.data_workers()[0]
        timeout = cfg.timeouts.request
        reply = (await post_all(self.stream, {owner: FetchEvalRequest(step)}, "fetch_eval", timeout))[owner]
        calls = [self._mfc(n) for n in cfg.eval_calls] + list(cfg.eval_mfcs)
        buffer = SampleBuffer(m.name for m in calls)
        buffer.add(reply.meta, owner=owner, step=step)
        dispatcher = CallDispatcher(buffer, self.stream, timeout, tags=self.calls.tags)
        record = self.records[step]
        for m in calls:
            ids = buffer.take_ready(m.name, m.input_keys, len(reply.meta.ids))
            if ids is None:
                raise RuntimeError(
                    f"evaluation: the inputs {m.input_keys} of {m.name!r} are not all produced"
                )
            placement = cfg.call_placement(m.name)
            posted = dispatcher.post(m, step, ids, placement.replicas(), self.copies.plan(m))
            result = await dispatcher.finish(m, posted)
            if m in cfg.eval_mfcs:
                record.update({f"eval/{k}": v for k, v in sorted(result.stats.items())})
                record["timing"]["eval"] = round(result.seconds, 4)
        clear = {
            w: self.stream.post(model_worker_name(w), "clear", list(reply.meta.ids)) for w in self.workers
        }
        await wait_replies(clear, model_worker_name, "clear", timeout)

    def _mfc(self, name: str) -> MFCDef:
        return next(m for m in self.config.mfcs if m.name == name)

    async def _save(self, mfc: MFCDef, steps_done: int) -> None:
        """Checkpoints of ``mfc``'s model after its training call of step ``steps_done - 1``; they
        go before that model's next call, so they hold exactly ``steps_done`` updates."""
        cfg, role = self.config, mfc.role
        workers = cfg.allocations[role]
        if self.schedule.save_due(steps_done):
            last = steps_done == self.total_steps
            path = checkpointing.hf_dir(cfg.run_dir, role, None if last else steps_done)
            req = SaveRequest(role, "hf", path, mfc.name)  # a sharded model gathers on every rank
            await post_all(self.stream, dict.fromkeys(workers, req), "save", cfg.timeouts.request)
        if self.schedule.recover_due(steps_done):
            path = checkpointing.recover_dir(cfg.run_dir, steps_done, role)
            req = SaveRequest(role, "recover", path, mfc.name, steps_done)
            await post_all(self.stream, dict.fromkeys(workers, req), "save", cfg.timeouts.request)
            await self._save_inflight(role, steps_done)
            self._recover_part_saved(steps_done, mfc.name)

    async def _save_inflight(self, role: str, steps_done: int) -> None:
        """Asynchronous RL: the answers of the generate calls of ``role`` at steps ``steps_done`` ..
        ``steps_done + max_staleness - 1`` go into the recover point of ``steps_done``. They were
        drawn from weights older than the point's (version k - max_staleness for step k), which a
        resumed run could not draw again; with them it trains on exactly the samples the
        uninterrupted run would have. Their calls are all posted by now (``VersionRule.ready``);
        this waits for them to finish."""
        cfg = self.config
        if cfg.async_rl is None:
            return
        upto = min(steps_done + self.versions.max_staleness, self.total_steps)
        gens = [
            m
            for m in cfg.mfcs
            if m.role == role and m.interface_type is ModelInterfaceType.GENERATE and m not in self.sampling
        ]
        for m in gens:
            await self.progress.wait_for(lambda m=m: self.progress.calls_done[m.name] >= upto)
            for k in range(steps_done, upto):
                await self.inflight.save(m, k, steps_done)

    async def _restore_generation(self, mfc: MFCDef, step: int, ids: list, clears: list[dict]) -> None:
        """A generate call whose answers the resumed recover point kept (``InflightAnswers``): they
        are read back, and the call counts as run with its saved report."""
        result, version = await self.inflight.restore(mfc, step, ids)
        self.copies.versions_used[(mfc.name, step)] = version
        self._posted(mfc, step)
        await self._after_call(mfc, step, result, clears)

    async def _save_state(self, mfc: MFCDef, steps_done: int) -> None:
        """A frozen role's interface state after its call of step ``steps_done - 1``, on every
        worker that runs the call (each rank's file)."""
        cfg = self.config
        requests = {
            w: SaveRequest(mfc.role, "state", path, mfc.name, steps_done)
            for m, w, path in self._state_files(steps_done)
            if m is mfc
        }
        await post_all(self.stream, requests, "save", cfg.timeouts.request)
        self._recover_part_saved(steps_done, mfc.name)

    def _recover_part_saved(self, steps_done: int, part: str) -> None:
        """Count ``part`` (a trained role's training MFC or a state MFC) as saved in the recover
        point of ``steps_done``; with every part saved, the point waits for its records."""
        parts = {*self.trained.values(), *(m.name for m in self.state_mfcs)}
        saved = self.recover_saved.setdefault(steps_done, set())
        saved.add(part)
        if saved == parts:
            del self.recover_saved[steps_done]
            self.recover_ready.append(steps_done)
            self._mark_recover_points()

    def _mark_recover_points(self) -> None:
        """Mark the newest complete recover point whose steps all have their record in
        stats.jsonl: a run killed between a checkpoint and its step's record resumes from the
        point before, and loses no record."""
        ready = [s for s in self.recover_ready if s <= self.progress.steps_done]
        if ready:
            checkpointing.mark_recover_point(self.config.run_dir, max(ready))
            self.recover_ready = [s for s in self.recover_ready if s > max(ready)]

    def _maybe_finish_step(self, step: int) -> None:
        while self.progress.steps_done < self.total_steps and all(
            n > self.progress.steps_done for n in self.progress.calls_done.values()
        ):
            done = self.progress.steps_done
            record = self.records.pop(done)
            record["time"] = time.time()
            self.stats.append(record)
            samples = record.get(SAMPLES_KEY)
            with open(self.stats_path, "a") as f:
                f.write(json.dumps({k: v for k, v in record.items() if k != SAMPLES_KEY}) + "\n")
            if samples:
                with open(self.samples_path, "a") as f:
                    f.write(json.dumps({"step": record["step"], SAMPLES_KEY: samples}) + "\n")
            logger.info("step %d/%d done: %s", done + 1, self.total_steps, brief(record))
            self.on_step(record, self.total_steps)
            self.progress.steps_done += 1
        self._mark_recover_points()

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
