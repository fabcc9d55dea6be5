"""Worker-to-worker tensor movement, the workers' half: a worker's tensor store, and the sends and
receives of the pieces the master planned (``transfer_plan``) over torch.distributed."""

from __future__ import annotations

import datetime
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.dtype_names import to_torch
from realrl.system.transfer_plan import PushOrder, TransferPiece


class TensorStore:
    """A worker's tensors of live samples: ``(id, key) -> tensor`` rows of that one sample.

    Where tensors live, the one rule: the store holds host tensors. What a call produces comes
    back to host memory here (``put``), what other workers send lands in host memory
    (``run_transfers``), and a call gets its inputs on its own model's device
    (``MFCRunner._call``). So a batch never joins pieces from two devices, a call never sees
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


class PendingSends:
    """Sends a worker posted and did not wait for: the worker goes on with its next request while
    the receiver takes the tensor whenever it gets there. A sender that waited would idle until
    a busy receiver (a training worker) reached its half, and under asynchronous RL a generation
    worker would stop generating for it. Each send's buffer is held until it completes; a send
    still incomplete after ``timeout`` seconds is an error naming what it carried."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.live: list[tuple[Any, torch.Tensor, str, float]] = []

    def __len__(self) -> int:
        return len(self.live)

    def add(self, work: Any, buf: torch.Tensor, what: str, dst: int) -> None:
        self.live.append((work, buf, f"{what} to worker {dst}", time.monotonic() + self.timeout))

    def reap(self) -> None:
        """Forget the completed sends; raise for one past its deadline."""
        now, keep = time.monotonic(), []
        for entry in self.live:
            work, _, what, deadline = entry
            if work.is_completed():
                work.wait()  # raises a send that failed
            elif now > deadline:
                raise TimeoutError(f"sending {what} did not complete in {self.timeout:.0f} s")
            else:
                keep.append(entry)
        self.live = keep

    def wait_all(self) -> None:
        """Wait for every send (before the worker exits, so no receiver is left waiting)."""
        for work, _, _, deadline in self.live:
            work.wait(timeout=datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        self.live = []


def run_transfers(
    store: TensorStore,
    pieces: Sequence[TransferPiece],
    me: int,
    timeout: float,
    sends: PendingSends | None = None,
) -> None:
    """Post every send and receive of ``pieces`` that involves worker ``me``, then wait for the
    receives (and for the sends too, unless ``sends`` takes them: ``PendingSends``)."""
    works, landed = [], []
    for p in pieces:
        if me not in (p.src, p.dst) or p.src == p.dst or (p.pushed and p.src == me):
            continue
        if p.src == me:
            if p.rows:
                wire = _wire(store.get(p.ids, p.key))
                work = dist.isend(wire, dst=p.dst, tag=p.tag)
                if sends is not None:
                    sends.add(work, wire, f"{p.key!r} of {len(p.ids)} samples (tag {p.tag})", p.dst)
                else:
                    works.append(work)
        else:
            dtype = to_torch(p.dtype)
            wire_dtype = torch.uint8 if dtype == torch.bool else dtype
            buf = torch.empty((p.rows, *p.trailing_shape), dtype=wire_dtype)
            if p.rows:
                works.append(dist.irecv(buf, src=p.src, tag=p.tag))
            landed.append((p, buf, dtype))
    for w in works:
        w.wait(timeout=datetime.timedelta(seconds=timeout))
    for p, buf, dtype in landed:
        t = buf.view(torch.bool) if dtype == torch.bool else buf
        off = 0
        for sid, lens in zip(p.ids, p.seqlens):
            n = sum(lens)
            store.tensors.setdefault(sid, {})[p.key] = t[off : off + n]
            off += n


def push_outputs(store: TensorStore, orders: Sequence[PushOrder], sends: PendingSends) -> None:
    """Post the sends of a call's pushes (its outputs, just stored) and leave them to ``sends``."""
    for order in orders:
        wire = _wire(store.get(order.ids, order.key))
        if wire.shape[0]:  # the receiver posts nothing for an empty piece either
            what = f"{order.key!r} of {len(order.ids)} samples (tag {order.tag})"
            sends.add(dist.isend(wire, dst=order.dst, tag=order.tag), wire, what, order.dst)
