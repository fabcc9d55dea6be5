"""Worker-to-worker tensor movement, the master's half: which tensor goes from which worker to which.

The master knows every live sample's metadata and which workers hold each (id, key); before a
call it plans ``TransferPiece``s (one tensor: one key of a run of ids, from one worker to
another) and hands each worker, in one request, every piece it sends or receives. A worker
posts all its sends and receives at once and then waits, so the pieces of one call can never
deadlock each other; calls never interleave on a worker because each handles its requests in
the order the master sent them. The workers' half, moving the bytes with torch.distributed, is
``data_transfer``; this one imports no torch, as the master must not.

Pushes (asynchronous RL): a call whose outputs later calls read on other workers sends them there
as soon as it has produced them (``PushOrder``), without waiting for the receivers; the later
call only receives (a ``TransferPiece`` with ``pushed``). Otherwise a busy producer (a
generation worker decoding the next batch) would hold each consumer's transfer until its current
call ended, and generation and training would take turns again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

from realrl.api.core.system_api import ExperimentConfig
from realrl.system.buffer import SampleBuffer


@dataclasses.dataclass
class TransferPiece:
    src: int
    dst: int
    key: str
    ids: list[Hashable]
    seqlens: list[list[int]]  # per id, as in SequenceSample.seqlens[key]
    dtype: str  # a dtype name (realrl.api.core.dtype_names)
    trailing_shape: tuple[int, ...]
    tag: int
    pushed: bool = False  # the source sent it when it produced it: only the receiver takes part

    @property
    def rows(self) -> int:
        return sum(sum(r) for r in self.seqlens)


@dataclasses.dataclass(frozen=True)
class PushOrder:
    """Send ``key`` of ``ids`` (all of them, back to back) to worker ``dst`` with ``tag`` once the
    call has produced it, and go on without waiting for the receiver."""

    key: str
    ids: list[Hashable]
    dst: int
    tag: int


TAG_MODULUS = 2**30


class TagCounter:
    """Unique torch.distributed tags for transfer pieces, pushes and weight moves."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> None:
        self.next = (self.next + n) % TAG_MODULUS


def push_targets(config: ExperimentConfig) -> dict[str, dict[str, list[int]]]:
    """MFC -> output key -> the workers that calls of the graph reading that key run on, each
    worker of such a call reading every sample (a call with one data-parallel rank): where each
    call's outputs are pushed (those of its own workers excepted). A worker of a data-parallel
    reader is not pushed to, as it reads only its share and would leave the rest unreceived.
    Static: the graph and the placements decide it."""
    out: dict[str, dict[str, list[int]]] = {}
    for producer in config.mfcs:
        keys: dict[str, list[int]] = {}
        for key in producer.output_keys:
            readers = {
                w
                for m in config.mfcs
                if key in m.input_keys and len(config.call_placement(m.name).replicas()) == 1
                for w in config.call_placement(m.name).workers
            }
            if readers:
                keys[key] = sorted(readers)
        out[producer.name] = keys
    return out


def plan_transfers(
    buffer: SampleBuffer, ids: Sequence[Hashable], keys: Sequence[str], dst: int, first_tag: int
) -> list[TransferPiece]:
    """Pieces that bring ``keys`` of ``ids`` to worker ``dst``; keys it already holds stay put.
    Reads the buffer only: the caller reports the pushed pieces taken
    (``SampleBuffer.receive_pushes``).

    A key pushed to ``dst`` is received whole, every id of the push (``dst`` holds them all from
    then on). Otherwise a key held by several workers is taken from the lowest index, so plans
    are reproducible.
    """
    pieces: list[TransferPiece] = []
    for key in keys:
        runs: dict[int, list[Hashable]] = {}
        received: set[Hashable] = set()  # ids of the pushes taken above: arriving with them
        for sid in ids:
            if sid in received or dst in buffer.owners(sid, key):
                continue
            push = buffer.pending_push(sid, key, dst)
            if push is not None:
                pieces.append(_piece(buffer, push.src, dst, key, list(push.ids), push.tag, pushed=True))
                received.update(push.ids)
                continue
            runs.setdefault(min(buffer.owners(sid, key)), []).append(sid)
        for src, run in sorted(runs.items()):
            pieces.append(_piece(buffer, src, dst, key, run, first_tag + len(pieces)))
    return pieces


def _piece(
    buffer: SampleBuffer, src: int, dst: int, key: str, ids: list[Hashable], tag: int, pushed: bool = False
) -> TransferPiece:
    meta = buffer.gather_meta(ids, [key])
    return TransferPiece(
        src, dst, key, ids, meta.seqlens[key], meta.dtypes[key], meta.trailing_shapes[key], tag, pushed
    )


def plan_pushes(
    targets: dict[str, list[int]],
    parts: list[tuple[list[int], list[Hashable]]],
    first_tag: int,
) -> list[tuple[int, PushOrder]]:
    """(source worker, order) for every output key of a call to every worker reading it that does
    not hold that part already: one push per data-parallel part (``parts``: its replica's workers,
    the first of which sends, and its ids). A worker of another replica of the same call is pushed
    to as well: it holds its own part only, and pulling the rest later would make the reader wait
    for this replica's worker to finish whatever call it runs by then (two trainings side by
    side would take turns)."""
    out = []
    for replica, ids in parts:
        for key, readers in sorted(targets.items()):
            for dst in readers:
                if dst not in replica:
                    out.append((replica[0], PushOrder(key, list(ids), dst, first_tag + len(out))))
    return out
