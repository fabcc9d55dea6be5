"""Worker-to-worker tensor movement, the workers' half: a worker's tensor store, and the sends and
receives of the pieces the master planned (``transfer_plan``) over torch.distributed."""

from __future__ import annotations

import datetime
from collections.abc import Hashable, Sequence

import torch
import torch.distributed as dist

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.dtype_names import to_torch
from realrl.system.transfer_plan import TransferPiece


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
