"""One model function call as the master runs it (``CallDispatcher``): post it (split over dp
ranks, plan the moves), then finish it (wait for the replies, record the outputs). Every worker of a data-parallel
replica (its tensor-parallel ranks) runs the call on the same share and produces the same
outputs; each keeps a copy, and the replica's first worker reports the statistics. The master may post a call before
finishing the previous one (``MasterWorker._run_calls``).

Everything one call asks of the workers is posted in one synchronous burst (no ``await`` in
between), one request per worker, so every worker sees the calls in the same global order: that
is what keeps torch.distributed transfers and data-parallel collectives free of deadlocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Hashable
from typing import Any

from realrl.api.core.data_api import MicroBatchSpec
from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import model_worker_name
from realrl.system.buffer import Push, SampleBuffer
from realrl.system.copies import CopyPlan
from realrl.system.protocol import MFCCall, MFCReply, MFCRequest, ReallocOrder, Segment
from realrl.system.request_reply_stream import MasterStream, WorkerError, WorkerLostError, wait_replies
from realrl.system.transfer_plan import TagCounter, plan_pushes, plan_transfers


@dataclasses.dataclass
class ReallocResult:
    """One reallocation as the run's statistics show it."""

    move: str  # "<home placement> -> <copy placement>"
    bytes: int  # received, summed over the workers
    seconds: float  # moving, once every worker was there: the slowest worker's
    wait_seconds: float  # the longest any worker waited for the others to arrive


@dataclasses.dataclass
class PushResult:
    """A call's weight pushes (asynchronous RL) as the run's statistics show them: a training
    call's sends of its new version, or the pushed versions a generate call received first."""

    bytes_sent: int  # summed over the sending workers
    send_blocked_s: float  # packing and posting: the slowest sending worker's
    recv_blocked_s: float  # receiving and scattering: the slowest receiving worker's


@dataclasses.dataclass
class CallResult:
    ids: list[Hashable]
    stats: dict[str, float]
    seconds: float
    n_tokens: int
    realloc: ReallocResult | None = None
    samples: list[dict] | None = None  # decoded examples the call reported (dp ranks' in order)
    dropped: list[Hashable] = dataclasses.field(default_factory=list)  # ids a filtering call drops
    unfinished: int = 0  # a generate call in pieces: answers still being decoded, all dp ranks
    rank_stats: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per dp rank
    push: PushResult | None = None
    # each worker's peak memory so far, as it replied (``MFCReply.peak_memory``), by worker index
    peak_memory: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)

    def then(self, later: CallResult) -> CallResult:
        """This piece of a generate call followed by ``later``: the workers' seconds add up, the
        statistics are the dp ranks' (each reports once, in the piece where it finished)."""
        ranks = {
            k: self.rank_stats.get(k, []) + later.rank_stats.get(k, [])
            for k in {*self.rank_stats, *later.rank_stats}
        }
        return CallResult(
            ids=later.ids,
            stats={k: sum(v) / len(v) for k, v in ranks.items()},
            seconds=self.seconds + later.seconds,
            n_tokens=later.n_tokens,
            realloc=later.realloc,
            samples=(self.samples or []) + (later.samples or []) or None,
            dropped=self.dropped + later.dropped,
            unfinished=later.unfinished,
            rank_stats=ranks,
            push=later.push,  # like realloc: an earlier piece's is in the step's record already
            peak_memory={**self.peak_memory, **later.peak_memory},
        )


@dataclasses.dataclass
class PostedCall:
    """A call whose requests are out: what ``CallDispatcher.finish`` needs once the replies come."""

    ids: list[Hashable]
    replicas: list[list[int]]  # the workers of each dp rank
    parts: list
    futures: dict[int, asyncio.Future]
    n_tokens: int
    tik: float
    realloc: ReallocOrder | None = None  # the weights moved for the call (reallocated or pushed)


class CallDispatcher:
    """Posts model function calls and collects their results: the master's buffer of sample
    metadata, its stream to the workers and its transfer tags, owned in one place."""

    def __init__(
        self,
        buffer: SampleBuffer,
        stream: MasterStream,
        timeout: float,
        tags: TagCounter | None = None,
        push_targets: dict[str, dict[str, list[int]]] | None = None,
    ):
        """``tags``: shared with another dispatcher whose calls may be in flight at the same time
        (transfer tags must be unique among the live ones). ``push_targets``
        (``transfer_plan.push_targets``): calls push their outputs to the workers that read them
        (asynchronous RL); None: consumers fetch them."""
        self.buffer, self.stream, self.timeout = buffer, stream, timeout
        self.tags = tags or TagCounter()
        self.push_targets = push_targets

    def post(
        self,
        mfc: MFCDef,
        step: int,
        ids: list[Hashable],
        replicas: list[list[int]],
        copy: CopyPlan | None = None,
        segment: Segment | None = None,
        push_weights: list[ReallocOrder] | None = None,
    ) -> PostedCall:
        """Post ``mfc`` on ``ids`` (already taken from the buffer) to every worker of each of its dp
        ranks (``replicas[d]``), in one synchronous burst; nothing is awaited. ``copy``: the call
        runs on a copy of its model, filled from home first when ``copy.realloc``. ``segment``: a
        piece of a generate call decoded in pieces; after the first, the workers hold the inputs
        already and nothing is moved but the weights. ``push_weights``: a training call's weight
        pushes (``CopyTracker.weight_pushes``), sent by its workers once it is done."""
        tik = time.monotonic()
        buffer, tags = self.buffer, self.tags
        meta = buffer.gather_meta(ids, mfc.input_keys)
        parts = meta.split(MicroBatchSpec(n_mbs=len(replicas)))  # token-balanced, contiguous
        requests: dict[int, MFCRequest] = {}
        order = None
        if copy is not None and copy.realloc:
            order = ReallocOrder(
                copy.role, copy.home, copy.placement, tags.next, copy.adapters_only, copy.version
            )
            tags.take(order.n_tags)
            for w in order.workers:
                requests[w] = MFCRequest([], realloc=order)
        for received in copy.receives if copy is not None else ():
            for w in received.dst.workers:  # the sources sent when their training call ended
                requests.setdefault(w, MFCRequest([])).weight_receives.append(received)
        for dp_rank, (workers, part) in enumerate(zip(replicas, parts)):
            for w in workers:
                if segment is not None and segment.index > 0:
                    pieces = []
                else:
                    pieces = plan_transfers(buffer, part.ids, mfc.input_keys, w, first_tag=tags.next)
                    buffer.receive_pushes(pieces)
                tags.take(len(pieces))
                for p in pieces:
                    if not p.pushed:  # a pushed piece's source sent it when it produced it
                        requests.setdefault(p.src, MFCRequest([])).pieces.append(p)
                requests.setdefault(w, MFCRequest([])).pieces.extend(pieces)
                requests[w].call = MFCCall(
                    mfc.name, step, dp_rank, part, copy and copy.name, bool(copy and copy.drop), segment
                )
        for w in requests:
            if requests[w].call is not None and push_weights:
                requests[w].call.push_weights = [o for o in push_weights if w in o.src.workers]
        if self.push_targets is not None and (segment is None or segment.index == 0):
            self._plan_pushes(mfc, replicas, parts, requests)
        futures = {
            w: self.stream.post(model_worker_name(w), "mfc", req, _describe(mfc, step, req))
            for w, req in sorted(requests.items())
        }
        n_tokens = sum(meta.token_counts())
        moved = order or (copy.receives[-1] if copy is not None and copy.receives else None)
        return PostedCall(list(ids), [list(r) for r in replicas], parts, futures, n_tokens, tik, moved)

    def _plan_pushes(self, mfc: MFCDef, replicas: list[list[int]], parts: list, requests: dict) -> None:
        """Attach to each dp rank's head the pushes of its outputs to the workers reading them, and
        record them for the readers' calls."""
        owned = [(list(r), list(part.ids)) for r, part in zip(replicas, parts)]
        orders = plan_pushes(self.push_targets.get(mfc.name, {}), owned, self.tags.next)
        self.tags.take(len(orders))
        for src, order in orders:
            requests[src].call.pushes.append(order)
            self.buffer.expect_push(Push(src, tuple(order.ids), order.tag), order.key, order.dst)

    async def finish(self, mfc: MFCDef, posted: PostedCall) -> CallResult:
        """Wait for a posted call's replies and put its outputs in the buffer."""
        buffer = self.buffer
        replies: dict[int, MFCReply] = await wait_replies(
            posted.futures, model_worker_name, f"mfc {mfc.name}", self.timeout
        )
        stats: dict[str, list[float]] = {}
        samples: list[dict] = []
        dropped: list[Hashable] = []
        unfinished = 0
        # the workers' own time on the call: a call posted early also waits behind the previous one
        worker_seconds = [r.seconds for r in replies.values() if r.seconds is not None]
        for workers, part in zip(posted.replicas, posted.parts):
            for w in workers:
                buffer.add_owner(part.ids, mfc.input_keys, w)  # it now holds copies of what it received
            head, reply = workers[0], replies[workers[0]]
            if reply.meta is not None:
                buffer.update(reply.meta, owner=head)
                for w in workers[1:]:  # its tensor-parallel ranks hold the same outputs
                    buffer.add_owner(reply.meta.ids, reply.meta.keys, w)
            for k, v in (reply.stats or {}).items():
                stats.setdefault(k, []).append(v)
            samples += reply.samples or []
            dropped += reply.dropped or []
            unfinished += reply.unfinished
        return CallResult(
            ids=posted.ids,
            stats={k: sum(v) / len(v) for k, v in stats.items()},  # mean over dp ranks
            seconds=max(worker_seconds) if worker_seconds else time.monotonic() - posted.tik,
            n_tokens=posted.n_tokens,
            realloc=_realloc_result(posted.realloc, replies),
            samples=samples or None,
            dropped=dropped,
            unfinished=unfinished,
            rank_stats=stats,
            push=_push_result(replies),
            peak_memory={w: r.peak_memory for w, r in replies.items() if r.peak_memory},
        )


def _describe(mfc: MFCDef, step: int, req: MFCRequest) -> str:
    """One worker's part of a call, in words."""
    what = f"MFC {mfc.name!r} (step {step})" if req.call else f"data for MFC {mfc.name!r} (step {step})"
    if req.call is not None and req.call.segment is not None:
        what += f", piece {req.call.segment.index}"
    if req.realloc is not None:
        what += f", after reallocating {req.realloc.role!r} {req.realloc.src} -> {req.realloc.dst}"
    return what


def _realloc_result(order: ReallocOrder | None, replies: dict[int, MFCReply]) -> ReallocResult | None:
    if order is None:
        return None
    # a pushed version's sources sent it with their training call: only its receivers report here
    reports = [replies[w].realloc or {} for w in order.workers if w in replies]
    return ReallocResult(
        move=f"{order.src} -> {order.dst}",
        bytes=int(sum(r.get("bytes_received", 0) for r in reports)),
        seconds=max((r.get("seconds", 0.0) for r in reports), default=0.0),
        wait_seconds=max((r.get("wait_seconds", 0.0) for r in reports), default=0.0),
    )


def _push_result(replies: dict[int, MFCReply]) -> PushResult | None:
    reports = [r.pushed for r in replies.values() if r.pushed]
    if not reports:
        return None
    return PushResult(
        bytes_sent=int(sum(r.get("bytes_sent", 0) for r in reports)),
        send_blocked_s=max(r.get("send_blocked_s", 0.0) for r in reports),
        recv_blocked_s=max(r.get("recv_blocked_s", 0.0) for r in reports),
    )


async def post_all(
    stream: MasterStream, requests: dict[int, Any], handler: str, timeout: float, what: str | None = None
) -> dict:
    """Post ``requests[w]`` to every worker ``w`` at once; their replies by worker index."""
    futures = {w: stream.post(model_worker_name(w), handler, data, what) for w, data in requests.items()}
    return await wait_replies(futures, model_worker_name, handler, timeout)


class FreeQueue:
    """Frees of samples every call is done with, each posted to the workers holding them
    (``SampleBuffer.release``) and not waited for: their replies are checked as they come
    (``reap``: a failed one is raised then, not at the end of the run) and at the end (``drain``)."""

    def __init__(self, stream: MasterStream, timeout: float):
        self.stream, self.timeout = stream, timeout
        self.pending: list[dict[int, asyncio.Future]] = []

    def post(self, by_worker: dict[int, list[Hashable]]) -> None:
        if by_worker:
            self.pending.append(
                {w: self.stream.post(model_worker_name(w), "clear", ids) for w, ids in by_worker.items()}
            )

    async def reap(self) -> None:
        """Check the replies already answered, oldest first."""
        while self.pending and all(f.done() for f in self.pending[0].values()):
            await wait_replies(self.pending.pop(0), model_worker_name, "clear", self.timeout)

    async def drain(self) -> None:
        while self.pending:
            await wait_replies(self.pending.pop(0), model_worker_name, "clear", self.timeout)


# what a worker's failure says when a peer it was exchanging tensors with went away (gloo's
# transport errors): most likely a consequence of that peer's death, not a fault of its own
PEER_LOST_MARKERS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket closed")


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a worker's request failing because a peer's connection broke."""
    return isinstance(error, WorkerError) and any(m in error.remote_traceback for m in PEER_LOST_MARKERS)


async def run_guarded(work: list[asyncio.Task], guard: asyncio.Task, grace: float = 0.0) -> None:
    """Wait until every ``work`` task is done; the first failure (of work or of the ``guard``,
    which only ever ends by raising) cancels everything else and is raised. A worker failing
    because a peer's connection broke (``peer_lost``) gives the guard up to ``grace`` seconds to
    find the peer lost: the lost worker is then the error raised (the root cause), with the
    survivor's failure attached."""
    everything = asyncio.gather(*work)
    try:
        await asyncio.wait([everything, guard], return_when=asyncio.FIRST_COMPLETED)
        if guard.done():
            guard.result()  # raises the guard's error
        failure = everything.exception() if everything.done() else None
        if failure is not None and grace > 0 and peer_lost(failure):
            await asyncio.wait([guard], timeout=grace)
            if guard.done():
                lost = guard.exception()
                if isinstance(lost, WorkerLostError):
                    raise WorkerLostError(
                        lost.worker, f"{lost.reason}; {failure.worker} then failed: {_last_line(failure)}"
                    ) from failure
        everything.result()
    finally:
        for t in [*work, guard]:
            if not t.done():
                t.cancel()
        await asyncio.gather(*work, guard, return_exceptions=True)
        if everything.done() and not everything.cancelled():
            everything.exception()  # mark as retrieved


def _last_line(error: WorkerError) -> str:
    lines = [line for line in error.remote_traceback.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__
