"""Worker-to-worker tensor movement: the master plans, workers move bytes with torch.distributed.

The master knows every live sample's metadata and which workers hold each (id, key); before a
call it plans ``TransferPiece``s (one tensor: one key of a run of ids, from one worker to
another) and hands each worker, in one request, every piece it sends or receives. A worker
posts all its sends and receives at once and then waits, so the pieces of one call can never
deadlock each other; calls never interleave on a worker because each handles its requests in
the order the master sent them.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Hashable, Sequence

import torch
import torch.distributed as dist

from realrl.api.core.data_api import SequenceSample
from realrl.system.buffer import SampleBuffer


@dataclasses.dataclass
class TransferPiece:
    src: int
    dst: int
    key: str
    ids: list[Hashable]
    seqlens: list[list[int]]  # per id, as in SequenceSample.seqlens[key]
    dtype: torch.dtype
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


class TensorStore:
    """A worker's tensors of live samples: ``(id, key) -> tensor`` rows of that one sample.

    Where tensors live, the one rule: the store holds host tensors. What a call produces comes
    back to host memory here (``put``), what other workers send lands in host memory
    (``run_transfers``), and a call gets its inputs on its own model's device
    (``ModelWorker._call``). So a batch never joins pieces from two devices, a call never sees
    host and device tensors side by side, and device memory holds models and the running call only.
    """

    def __init__(self) -> None:
        self.tensors: dict[Hashable, dict[str, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.tensors)

    def put(self, sample: SequenceSample) -> None:
        """Keep every key of every sample of ``sample`` (which must hold data), in host memory."""
        if sample.data is None:
            raise ValueError("TensorStore.put needs a sample with data, got metadata only")
        for key in sample.keys:
            t = sample.data[key]
            if t is None:
                continue
            t = t.detach().to("cpu")
            off = sample.sample_offsets(key)
            for i, sid in enumerate(sample.ids):
                self.tensors.setdefault(sid, {})[key] = t[off[i] : off[i + 1]]

    def get(self, ids: Sequence[Hashable], key: str) -> torch.Tensor:
        missing = [sid for sid in ids if key not in self.tensors.get(sid, {})]
        if missing:
            raise KeyError(f"this worker holds no {key!r} for ids {missing[:5]} (of {len(missing)})")
        return torch.cat([self.tensors[sid][key] for sid in ids], dim=0)

    def assemble(self, meta: SequenceSample) -> SequenceSample:
        """``meta`` (ids, keys, lengths, metadata) filled with this worker's tensors."""
        data = {k: self.get(meta.ids, k) for k in meta.keys}
        return SequenceSample(
            keys=meta.keys,
            trailing_shapes=meta.trailing_shapes,
            dtypes=meta.dtypes,
            ids=meta.ids,
            seqlens=meta.seqlens,
            data=data,
            metadata=meta.metadata,
        )

    def drop(self, ids: Sequence[Hashable]) -> int:
        return sum(self.tensors.pop(sid, None) is not None for sid in ids)


def _wire(t: torch.Tensor) -> torch.Tensor:
    """What goes over gloo: CPU memory (gloo has no CUDA point-to-point), bools as bytes."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def run_transfers(store: TensorStore, pieces: Sequence[TransferPiece], me: int, timeout: float) -> None:
    """Post every send and receive of ``pieces`` that involves worker ``me``, then wait for all."""
    works, landed = [], []
    for p in pieces:
        if me not in (p.src, p.dst) or p.src == p.dst:
            continue
        if p.src == me:
            if p.rows:
                works.append(dist.isend(_wire(store.get(p.ids, p.key)), dst=p.dst, tag=p.tag))
        else:
            wire_dtype = torch.uint8 if p.dtype == torch.bool else p.dtype
            buf = torch.empty((p.rows, *p.trailing_shape), dtype=wire_dtype)
            if p.rows:
                works.append(dist.irecv(buf, src=p.src, tag=p.tag))
            landed.append((p, buf))
    for w in works:
        w.wait(timeout=datetime.timedelta(seconds=timeout))
    for p, buf in landed:
        t = buf.view(torch.bool) if p.dtype == torch.bool else buf
        off = 0
        for sid, lens in zip(p.ids, p.seqlens):
            n = sum(lens)
            store.tensors.setdefault(sid, {})[p.key] = t[off : off + n]
            off += n
