"""Worker-to-worker tensor movement, the master's half: which tensor goes from which worker to which.

The master knows every live sample's metadata and which workers hold each (id, key); before a
call it plans ``TransferPiece``s (one tensor: one key of a run of ids, from one worker to
another) and hands each worker, in one request, every piece it sends or receives. A worker
posts all its sends and receives at once and then waits, so the pieces of one call can never
deadlock each other; calls never interleave on a worker because each handles its requests in
the order the master sent them. The workers' half, moving the bytes with torch.distributed, is
``data_transfer``; this one imports no torch, as the master must not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

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

    @property
    def rows(self) -> int:
        return sum(sum(r) for r in self.seqlens)


def plan_transfers(
    buffer: SampleBuffer, ids: Sequence[Hashable], keys: Sequence[str], dst: int, first_tag: int
) -> list[TransferPiece]:
    """Pieces that bring ``keys`` of ``ids`` to worker ``dst``; keys it already holds stay put.

    A key held by several workers is taken from the lowest index, so plans are reproducible.
    """
    pieces: list[TransferPiece] = []
    for key in keys:
        runs: dict[int, list[Hashable]] = {}
        for sid in ids:
            owners = buffer.owners(sid, key)
            if dst not in owners:
                runs.setdefault(min(owners), []).append(sid)
        for src, run in sorted(runs.items()):
            meta = buffer.gather_meta(run, [key])
            pieces.append(
                TransferPiece(
                    src,
                    dst,
                    key,
                    run,
                    meta.seqlens[key],
                    meta.dtypes[key],
                    meta.trailing_shapes[key],
                    first_tag + len(pieces),
                )
            )
    return pieces
