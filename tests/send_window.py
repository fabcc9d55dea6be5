"""NCCL's blocking window for point-to-point sends, agreed on by the ranks through a shared store.

NCCL runs the operations between a pair of ranks in order, and a send completes only once the
peer has posted its receive, beyond the little the connection buffers; gloo buffers any number
of sends, so a schedule that relies on buffering passes on CPU and hangs on GPUs. ``SendWindow``
is the one place that decides whether a send may go: each rank counts the receives it posts, per
channel (a group) and pair, in a store every rank reaches, and a send is admitted only while at
most ``window`` messages toward its peer on that channel have no receive posted there. A send
beyond it waits; after ``timeout_s`` it raises, naming the pair, the channel and the messages
outstanding. Both checks that hold gloo to this rule use it: ``tests/parallel/p2p_window.py``
(the pipeline schedules' unit tests) and ``tests/collective_rules.py`` (every end-to-end run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch.distributed as dist

POLL_S = 0.002  # between two reads of the peer's count while a send waits


class SendWindow:
    """Admits each send only within the window of receives its peer has posted."""

    def __init__(
        self,
        store: dist.Store,
        window: int = 2,
        timeout_s: float = 10.0,
        error: type[Exception] = RuntimeError,
        prefix: str = "",
    ):
        self.store, self.window, self.timeout_s, self.error, self.prefix = (
            store,
            window,
            timeout_s,
            error,
            prefix,
        )

    def _key(self, channel: str, src: int, dst: int) -> str:
        return f"{self.prefix}posted/{channel + '/' if channel else ''}{src}->{dst}"

    def post(self, src: int, dst: int, channel: str = "", count: int = 1) -> None:
        """Count ``count`` receives ``dst`` posted from ``src`` on ``channel``."""
        self.store.add(self._key(channel, src, dst), count)

    def admit(self, src: int, dst: int, sent: Sequence[object], channel: str = "") -> None:
        """Return once the last of ``sent`` (every message ``src`` sent ``dst`` on ``channel``, in
        order, described) is within the window; raise ``error`` after ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            posted = self.store.add(self._key(channel, src, dst), 0)
            if len(sent) - posted <= self.window:
                return
            if time.monotonic() > deadline:
                on = f" on {channel}" if channel else ""
                outstanding = ", ".join(str(m) for m in sent[posted:])
                raise self.error(
                    f"rank {src} -> rank {dst}{on}: send {sent[-1]} blocks: {len(sent) - posted} messages "
                    f"toward rank {dst} have no receive posted there (window {self.window}; rank {dst} "
                    f"posted {posted} receives from rank {src} in {self.timeout_s:g} s); "
                    f"outstanding: {outstanding}"
                )
            time.sleep(POLL_S)
