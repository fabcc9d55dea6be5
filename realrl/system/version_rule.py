"""The master's parameter-version rule, and the bound asynchronous RL relaxes it to.

A call that reads a model's weights at step k waits for every training call of that model at
step k - 1, so it sees the weights of k training steps. Under asynchronous RL
(``ExperimentConfig.async_rl``) a generate call waits only for step k - 1 - max_staleness: it runs
up to ``max_staleness`` steps ahead, and the loader fetches that many more batches ahead.

This is the stateless half of the asynchrony policy (``asynchrony``): every decision that depends
on whether the run is asynchronous (the bound, pieces, live steps, kept generation copies, weight
pushes) is read from here; it holds no state of the run.
"""

from __future__ import annotations

from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.system_api import ExperimentConfig

# steps in flight: the call running, the next one posted early (the master's _run_calls), and two
# more dataset batches fetched ahead, so the next batch is in the buffer before it is needed
MAX_LIVE_STEPS = 4


class VersionRule:
    def __init__(self, config: ExperimentConfig):
        self.config = config
        self.asynchronous = config.async_rl is not None
        self.max_staleness = config.async_rl.max_staleness if self.asynchronous else 0

    def lead(self, mfc: MFCDef) -> int:
        """How many steps ``mfc`` may run ahead of its model's training: ``max_staleness`` for a
        generate call under asynchronous RL, else 0."""
        return self.max_staleness if mfc.interface_type is ModelInterfaceType.GENERATE else 0

    def pieces(self, mfc: MFCDef) -> int | None:
        """Partial rollouts: the tokens per piece ``mfc``'s calls decode in, for a generate call
        under asynchronous RL with ``interrupt_every`` set; else None (one piece)."""
        if not self.asynchronous or mfc.interface_type is not ModelInterfaceType.GENERATE:
            return None
        return self.config.async_rl.interrupt_every

    def keeps_copy(self, mfc: MFCDef) -> bool:
        """Whether ``mfc``'s copy of its model stays filled between calls: a generate call's under
        asynchronous RL, which samples ahead of training from a version it must keep."""
        return self.asynchronous and mfc.interface_type is ModelInterfaceType.GENERATE

    def pushes_weights(self) -> bool:
        """Whether training calls push each new version to the generation copies on workers of
        their own: under asynchronous RL, on every device (over NCCL on GPUs, gloo on CPUs)."""
        return self.asynchronous

    def serves_a_call(self, version: int, total_steps: int) -> bool:
        """Whether a generate call will sample from ``version`` (version v serves the call of step
        v + max_staleness): only then is it pushed."""
        return version + self.max_staleness < total_steps

    @property
    def live_steps(self) -> int:
        """Steps the loader fetches ahead of the last finished one: room for generation to run
        ``max_staleness`` steps ahead, and the next batch in the buffer before it is needed."""
        return MAX_LIVE_STEPS + self.max_staleness

    def training_calls_of(self, mfc: MFCDef) -> list[str]:
        """The other training calls of ``mfc``'s model (the rule waits on them)."""
        return self._calls_of(mfc, ModelInterfaceType.TRAIN_STEP)

    def _calls_of(self, mfc: MFCDef, kind: ModelInterfaceType) -> list[str]:
        return [
            m.name
            for m in self.config.mfcs
            if m.role == mfc.role and m.interface_type is kind and m is not mfc
        ]

    def ready(
        self,
        mfc: MFCDef,
        step: int,
        calls_done: dict[str, int],
        calls_posted: dict[str, int],
        total_steps: int,
    ) -> bool:
        """Whether ``mfc``'s call at ``step`` may read (or, training, change) its model's weights
        now. A non-training call waits for its model's training calls at ``step - 1 - lead(mfc)``
        (``calls_done``: calls finished per MFC).

        Under asynchronous RL a training call at ``step`` t also waits until every generate call
        of its model up to step t + max_staleness has been posted (``calls_posted``): the weights
        a generate call of step k reads are then exactly those of k - max_staleness training steps,
        whatever the timing, so an asynchronous run is reproducible (and resumable exactly) like
        a synchronous one. Those calls need only steps before t, so the wait never blocks."""
        if mfc.interface_type is ModelInterfaceType.TRAIN_STEP:
            if not self.asynchronous:
                return True
            upto = min(step + 1 + self.max_staleness, total_steps)
            return all(calls_posted[g] >= upto for g in self._calls_of(mfc, ModelInterfaceType.GENERATE))
        trains = self.training_calls_of(mfc)
        return all(calls_done[t] >= step - self.lead(mfc) for t in trains)

    def sampled_versions(
        self, train: MFCDef, step: int, versions_used: dict[tuple[str, int], int]
    ) -> list[int]:
        """The versions of ``train``'s model that the generate calls of ``step`` sampled from
        (``versions_used``: the copies' record, (call, step) -> version)."""
        return [
            v
            for m in self.config.mfcs
            if m.role == train.role and m.interface_type is ModelInterfaceType.GENERATE
            if (v := versions_used.get((m.name, step))) is not None
        ]
