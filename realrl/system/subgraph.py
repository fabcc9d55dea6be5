"""A sub-graph run apart from the main loop: a few calls of the graph, one after the other, on a
batch of their own in a private buffer. Dynamic sampling runs its rounds this way (generate,
score, filter) and evaluation its held-out rollouts (generate, score, statistics).

The calls share the master's transfer tags and copy tracker, since they interleave with the
graph's own calls on the same workers; the private buffer keeps their ids apart from the step's.
"""

from __future__ import annotations

from collections.abc import Sequence

from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import ExperimentConfig
from realrl.system.buffer import SampleBuffer
from realrl.system.copies import CopyTracker
from realrl.system.data_feed import Batch
from realrl.system.function_call import CallDispatcher, CallResult
from realrl.system.request_reply_stream import MasterStream
from realrl.system.transfer_plan import TagCounter


class SubgraphExecutor:
    def __init__(self, config: ExperimentConfig, stream: MasterStream, tags: TagCounter, copies: CopyTracker):
        self.config, self.stream, self.tags, self.copies = config, stream, tags, copies

    def buffer(self, mfcs: Sequence[MFCDef]) -> SampleBuffer:
        """A private buffer for the calls ``mfcs``."""
        return SampleBuffer(m.name for m in mfcs)

    async def run(
        self,
        what: str,
        mfcs: Sequence[MFCDef],
        buffer: SampleBuffer,
        batch: Batch,
        step: int,
        versioned: bool = True,
    ) -> dict[str, CallResult]:
        """Add ``batch`` to ``buffer`` and run ``mfcs`` on it in order, each on the whole batch;
        every call's result by name. ``versioned``: the calls belong to training step ``step``
        (the copy tracker records the model version each runs on), else to an evaluation."""
        calls = CallDispatcher(buffer, self.stream, self.config.timeouts.request, tags=self.tags)
        n = 0
        for owner, meta in batch:
            buffer.add(meta, owner=owner, step=step)
            n += len(meta.ids)
        results = {}
        for m in mfcs:
            ids = buffer.take_ready(m.name, m.input_keys, n)
            if ids is None:
                raise RuntimeError(f"{what}: the inputs {m.input_keys} of {m.name!r} are not ready")
            replicas = self.config.call_placement(m.name).replicas()
            posted = calls.post(m, step, ids, replicas, self.copies.plan(m, step if versioned else None))
            results[m.name] = await calls.finish(m, posted)
        return results
