"""Evaluation during a run: after a trained model's training call, when the schedule says so.

Two kinds. A model with evaluation sets (SFT, reward modeling, DPO) evaluates on every
data-parallel rank's shard through its interface (``evaluate`` requests); the mean of the ranks
goes into the step's record as ``<mfc>/<stat>``. An RL run (``eval_prompts``) rolls out on
held-out prompts once per evaluation, after the policy's update: the graph's ``eval_calls``
(generate, score, reference) and then the ``eval_mfcs`` as a sub-graph on a private buffer; the
statistics of the ``eval_mfcs`` go into the record as ``eval/<stat>``.
"""

from __future__ import annotations

from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import ExperimentConfig
from realrl.system.data_feed import DataFeed
from realrl.system.function_call import FreeQueue, post_all
from realrl.system.protocol import EvaluateRequest
from realrl.system.request_reply_stream import MasterStream
from realrl.system.schedule import Schedule
from realrl.system.step_log import StepLog
from realrl.system.subgraph import SubgraphExecutor


class Evaluator:
    def __init__(
        self,
        config: ExperimentConfig,
        stream: MasterStream,
        feed: DataFeed,
        executor: SubgraphExecutor,
        log: StepLog,
    ):
        self.config, self.stream, self.feed, self.executor, self.log = config, stream, feed, executor, log
        by_name = {m.name: m for m in config.mfcs}
        self.rollout_calls = [by_name[n] for n in config.eval_calls] + list(config.eval_mfcs)

    async def after_training(self, mfc: MFCDef, step: int, schedule: Schedule) -> None:
        """Evaluate ``mfc``'s model after its training call of ``step`` if it is due."""
        cfg = self.config
        if not schedule.eval_due(step + 1):
            return
        if cfg.eval_prompts is not None:
            if mfc.role == self.rollout_calls[0].role:  # once, after the policy's update
                await self._rollouts(step)
            return
        placement = cfg.placement(mfc.role)
        req = EvaluateRequest(mfc.role, mfc.name)
        replies = await post_all(
            self.stream, dict.fromkeys(placement.workers, req), "evaluate", cfg.timeouts.request
        )
        heads = [replies[w] for w in placement.heads()]  # a replica's tp ranks report the same
        keys = sorted({k for r in heads for k in r})
        stats = {}
        for k in keys:
            values = [r[k] for r in heads if k in r]
            stats[f"{mfc.name}/{k}"] = sum(values) / len(values)
        self.log.add(step, stats)

    async def _rollouts(self, step: int) -> None:
        batch = await self.feed.eval_batch(step)
        buffer = self.executor.buffer(self.rollout_calls)
        results = await self.executor.run(
            "evaluation", self.rollout_calls, buffer, batch, step, versioned=False
        )
        for m in self.config.eval_mfcs:
            result = results[m.name]
            self.log.add(step, {f"eval/{k}": v for k, v in sorted(result.stats.items())})
            self.log.timing(step, "eval", result.seconds)
        frees = FreeQueue(self.stream, self.config.timeouts.request)
        frees.post(buffer.holders([sid for _, meta in batch for sid in meta.ids]))
        await frees.drain()
