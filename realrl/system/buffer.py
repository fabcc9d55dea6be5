"""The master's view of live samples: which keys of which ids are ready, and which workers hold them.

Only metadata lives here (``SequenceSample.meta()`` per id). An MFC takes the first ``n_seqs`` ids
(in arrival order) it has not taken yet, and fires once all of them have its input keys; taking
them in arrival order, not readiness order, keeps batches identical from run to run whatever the
timing. An id leaves the buffer once every MFC of the graph has finished with it, and only the workers
holding one of its keys are told to free it.

The buffer is the one record of who holds which (id, key): a dataset batch's owner, a call's
outputs on its workers, the copies a call received, and the pushes in flight (a producer sending
outputs to the workers that will read them, ``transfer_plan``). Planners read it and never write
it; the dispatcher reports what each call moved.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Hashable, Iterable, Sequence

from realrl.api.core.data_api import SequenceSample


@dataclasses.dataclass(frozen=True)
class Push:
    """A push in flight, as the buffer records it until a call on its destination receives it."""

    src: int
    ids: tuple[Hashable, ...]
    tag: int


@dataclasses.dataclass
class _Entry:
    meta: SequenceSample  # one sample, metadata only, every key produced so far
    owners: dict[str, set[int]]  # key -> workers holding its tensor
    step: int
    taken: set[str] = dataclasses.field(default_factory=set)  # MFCs that took this id
    finished: set[str] = dataclasses.field(default_factory=set)  # MFCs done with it


class SampleBuffer:
    def __init__(self, mfc_names: Iterable[str]):
        self.mfc_names = frozenset(mfc_names)
        self.entries: dict[Hashable, _Entry] = {}
        self._waiters: list[asyncio.Future] = []
        # pushes in flight: (id, key, destination worker) -> the push carrying it
        self.pushes: dict[tuple[Hashable, str, int], Push] = {}

    def __len__(self) -> int:
        return len(self.entries)

    # -- updates -------------------------------------------------------------------------------

    def _changed(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    def add(self, meta: SequenceSample, owner: int, step: int) -> None:
        """New samples (a dataset batch) whose every key is held by worker ``owner``."""
        if meta.data is not None:
            raise ValueError("the buffer holds metadata only; pass sample.meta()")
        for one in meta.unpack():
            sid = one.ids[0]
            if sid in self.entries:
                raise ValueError(f"sample id {sid!r} is already live in the buffer (ids must be unique)")
            self.entries[sid] = _Entry(one, {k: {owner} for k in one.keys}, step)
        self._changed()

    def move_to(self, other: SampleBuffer, ids: Sequence[Hashable]) -> None:
        """Hand ``ids`` (their keys so far and where they live) to ``other``, where no MFC has
        taken them yet: samples that passed a filter join the graph's buffer."""
        for sid in ids:
            if sid in other.entries:
                raise ValueError(f"sample id {sid!r} is already live in the buffer (ids must be unique)")
        for sid in ids:
            entry = self.entries.pop(sid)
            other.entries[sid] = _Entry(entry.meta, entry.owners, entry.step)
        self._changed()
        other._changed()

    def update(self, meta: SequenceSample, owner: int) -> None:
        """Keys an MFC produced on worker ``owner`` for ids already live."""
        for one in meta.unpack():
            entry = self._entry(one.ids[0])
            entry.meta.update_(one)
            for k in one.keys:
                entry.owners[k] = {owner}  # a key produced anew supersedes older copies
        self._changed()

    def add_owner(self, ids: Sequence[Hashable], keys: Iterable[str], worker: int) -> None:
        """``worker`` received copies of ``keys`` of ``ids`` (it keeps them until they are freed)."""
        keys = list(keys)
        for sid in ids:
            entry = self._entry(sid)
            for k in keys:
                entry.owners[k].add(worker)

    def expect_push(self, push: Push, key: str, dst: int) -> None:
        """``push.src`` will send ``key`` of ``push.ids`` to ``dst`` once it has produced it."""
        for sid in push.ids:
            self.pushes[(sid, key, dst)] = push

    def receive_pushes(self, pieces: Iterable) -> None:
        """The pushed ``TransferPiece``s a call's plan takes: each push is forgotten for all its ids
        and its destination counted as holding them (it receives them before any later request of
        its own, and sends nothing before it has)."""
        for piece in pieces:
            if not piece.pushed:
                continue
            for sid in piece.ids:
                self.pushes.pop((sid, piece.key, piece.dst), None)
                self._entry(sid).owners[piece.key].add(piece.dst)

    # -- queries -------------------------------------------------------------------------------

    def _entry(self, sid: Hashable) -> _Entry:
        try:
            return self.entries[sid]
        except KeyError:
            raise KeyError(f"sample id {sid!r} is not live in the buffer") from None

    def next_ids(self, mfc: str, n: int) -> list[Hashable] | None:
        """The first ``n`` ids ``mfc`` has not taken yet, or None if fewer are live."""
        out = [sid for sid, e in self.entries.items() if mfc not in e.taken][:n]
        return out if len(out) == n else None

    def is_ready(self, ids: Sequence[Hashable], keys: Iterable[str]) -> bool:
        keys = set(keys)
        return all(keys <= self.entries[sid].meta.keys for sid in ids)

    def pending_push(self, sid: Hashable, key: str, dst: int) -> Push | None:
        """The push bringing ``key`` of ``sid`` to ``dst``, if one is in flight."""
        return self.pushes.get((sid, key, dst))

    def owners(self, sid: Hashable, key: str) -> set[int]:
        entry = self._entry(sid)
        if key not in entry.owners:
            raise KeyError(f"key {key!r} of sample {sid!r} is not ready (has {sorted(entry.meta.keys)})")
        return entry.owners[key]

    def step_of(self, sid: Hashable) -> int:
        return self._entry(sid).step

    def gather_meta(self, ids: Sequence[Hashable], keys: Iterable[str]) -> SequenceSample:
        keys = list(keys)
        return SequenceSample.gather([self._entry(sid).meta.select(keys) for sid in ids], keys)

    # -- waiting and consuming ----------------------------------------------------------------

    def take_ready(self, mfc: str, keys: Iterable[str], n: int) -> list[Hashable] | None:
        """The next ``n`` ids of ``mfc`` if they already hold ``keys`` (marked taken), else None."""
        ids = self.next_ids(mfc, n)
        if ids is None or not self.is_ready(ids, keys):
            return None
        for sid in ids:
            self.entries[sid].taken.add(mfc)
        return ids

    async def take(self, mfc: str, keys: Iterable[str], n: int) -> list[Hashable]:
        """Wait for the next ``n`` ids of ``mfc`` to hold ``keys``; mark them taken by it."""
        keys = list(keys)
        while True:
            ids = self.take_ready(mfc, keys, n)
            if ids is not None:
                return ids
            await self.next_change()

    def next_change(self) -> asyncio.Future:
        """A future resolved at the buffer's next change (samples added, keys produced, freed)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def finish(self, mfc: str, ids: Sequence[Hashable]) -> list[Hashable]:
        """``mfc`` is done with ``ids``; return (and drop) the ids every MFC is now done with."""
        done = []
        for sid in ids:
            entry = self._entry(sid)
            entry.finished.add(mfc)
            if entry.finished >= self.mfc_names:
                done.append(sid)
        for sid in done:
            del self.entries[sid]
        self._changed()
        return done

    def release(self, mfc: str, ids: Sequence[Hashable]) -> dict[int, list[Hashable]]:
        """``finish``, and which worker holds which of the ids dropped: the frees to send."""
        holders = self.holders(ids)
        done = set(self.finish(mfc, ids))
        return {w: [sid for sid in held if sid in done] for w, held in holders.items() if done & set(held)}

    def holders(self, ids: Sequence[Hashable]) -> dict[int, list[Hashable]]:
        """Worker -> the ids of ``ids`` it holds a key of, in the order given."""
        out: dict[int, list[Hashable]] = {}
        for sid in ids:
            for w in sorted(set().union(*self._entry(sid).owners.values())):
                out.setdefault(w, []).append(sid)
        return dict(sorted(out.items()))

    def live_steps(self) -> set[int]:
        return {e.step for e in self.entries.values()}
