"""Point-to-point messages held to NCCL's rules on gloo, for the tests of the pipeline schedules.

NCCL runs the operations between a pair of ranks in order, and a send completes only once the
peer has posted its receive, beyond the little that the connection buffers. gloo buffers any
number of sends, so a schedule that relies on buffering passes every CPU run and hangs on GPUs.
``WindowedP2P`` has torch.distributed's point-to-point calls (``isend``, ``send``, ``irecv``,
``recv``, ``batch_isend_irecv``, same signatures) and the schedules take it where they take
torch.distributed's (``StageLinks.p2p``). Before handing a message to gloo it

- lets a send go only while at most ``window`` messages toward its peer have no receive posted
  there (a send waits for that; after ``timeout_s`` it raises ``P2PWindowError`` naming the pair,
  the tags and the messages outstanding): a schedule that passes with a small window does not
  rely on buffering;
- checks that the k-th receive a rank posts from a peer is of the k-th message that peer sent
  it: the same tag, shape and dtype (``P2PWindowError`` otherwise).

The operations of one ``batch_isend_irecv`` are posted together, as NCCL's group calls do: its
receives count as posted before any of its sends waits. Ranks agree through a shared store:
each pair's count of posted receives (the window itself is ``tests/send_window.py``'s, which the
check of every end-to-end run, ``tests/collective_rules.py``, shares), and a description of every
message sent.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from send_window import SendWindow


class P2PWindowError(RuntimeError):
    """A point-to-point exchange that would hang on NCCL (or mismatch its messages)."""


@dataclasses.dataclass(frozen=True)
class _Message:
    index: int  # the message's place among those from its sender to its receiver
    tag: int
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, index: int, tensor: torch.Tensor, tag: int) -> _Message:
        return cls(index, tag, tuple(tensor.shape), str(tensor.dtype))

    def encode(self) -> str:
        return f"{self.tag}|{','.join(map(str, self.shape))}|{self.dtype}"

    @classmethod
    def decode(cls, index: int, text: str) -> _Message:
        tag, shape, dtype = text.split("|")
        return cls(index, int(tag), tuple(int(n) for n in shape.split(",") if n), dtype)

    def __str__(self) -> str:
        return f"#{self.index} (tag {self.tag}, shape {list(self.shape)}, {self.dtype})"


class WindowedP2P:
    """torch.distributed's point-to-point calls, each send admitted only within the window."""

    def __init__(self, store: dist.Store, window: int = 2, timeout_s: float = 10.0, transport: Any = dist):
        self.store, self.window, self.timeout_s, self.transport = store, window, timeout_s, transport
        self.admission = SendWindow(store, window, timeout_s, error=P2PWindowError)
        self.rank = dist.get_rank()
        self.sent: dict[int, list[_Message]] = defaultdict(list)  # by receiver: every message sent
        self.posted: dict[int, int] = defaultdict(int)  # by sender: receives posted from it

    @staticmethod
    def _message_key(src: int, dst: int, index: int) -> str:
        return f"message/{src}->{dst}/{index}"

    def _admit(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        """Wait until this send is within the window toward ``dst``, then describe it there."""
        mine = self.sent[dst]
        message = _Message.of(len(mine), tensor, tag)
        mine.append(message)
        self.admission.admit(self.rank, dst, mine)
        self.store.set(self._message_key(self.rank, dst, message.index), message.encode())

    def _post(self, src: int) -> int:
        """Count a receive from ``src`` as posted; its index among the receives from ``src``."""
        index = self.posted[src]
        self.posted[src] += 1
        self.admission.post(src, self.rank)
        return index

    def _check(self, tensor: torch.Tensor, src: int, tag: int, index: int) -> None:
        """The ``index``-th receive from ``src`` must take the ``index``-th message it sent here."""
        want = _Message.of(index, tensor, tag)
        key = self._message_key(src, self.rank, index)
        try:
            self.store.wait([key], datetime.timedelta(seconds=self.timeout_s))
        except (RuntimeError, dist.DistError) as e:
            raise P2PWindowError(
                f"rank {src} -> rank {self.rank}: receive {want} waits {self.timeout_s:g} s for a message "
                f"rank {src} never sent"
            ) from e
        sent = _Message.decode(index, self.store.get(key).decode())
        if sent != want:
            raise P2PWindowError(
                f"rank {src} -> rank {self.rank}: messages out of step: rank {src} sent {sent}, "
                f"rank {self.rank} receives {want}"
            )

    def isend(self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> Any:
        self._admit(tensor, dst, tag)
        return self.transport.isend(tensor, dst, group=group, tag=tag)

    def send(self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> None:
        self._admit(tensor, dst, tag)
        self.transport.send(tensor, dst, group=group, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, group: Any = None, tag: int = 0) -> Any:
        self._check(tensor, src, tag, self._post(src))
        return self.transport.irecv(tensor, src, group=group, tag=tag)

    def recv(self, tensor: torch.Tensor, src: int, group: Any = None, tag: int = 0) -> int:
        self._check(tensor, src, tag, self._post(src))
        return self.transport.recv(tensor, src, group=group, tag=tag)

    def batch_isend_irecv(self, p2p_op_list: list[dist.P2POp]) -> list[Any]:
        """Post the batch's receives, admit its sends, check the receives, then run it."""
        receives = [op for op in p2p_op_list if op.op is dist.irecv]
        indices = [self._post(op.peer) for op in receives]
        for op in p2p_op_list:
            if op.op is dist.isend:
                self._admit(op.tensor, op.peer, op.tag)
        for op, index in zip(receives, indices):
            self._check(op.tensor, op.peer, op.tag, index)
        return self.transport.batch_isend_irecv(p2p_op_list)


def windowed_p2p(store_path: str, world_size: int, window: int = 2, timeout_s: float = 10.0) -> WindowedP2P:
    """The calls of one rank of ``world_size`` spawned ranks sharing the file ``store_path``."""
    store = dist.FileStore(store_path, world_size)
    return WindowedP2P(store, window, timeout_s)
