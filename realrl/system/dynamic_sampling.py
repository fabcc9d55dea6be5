"""DAPO's dynamic sampling as the master runs it (``ExperimentConfig.dynamic_sampling``).

A step's sampling calls (the filter and the calls it depends on: generate, score) run in
rounds. Each round fetches the next batch of prompts along the dataset (continuing into the next
epoch's order at the end of one), runs the calls on it in graph order and drops the samples the
filter names. Once the rounds have kept n_seqs samples, the first n_seqs kept (in arrival order,
so a seed gives the same batch whatever the timing) go on to the rest of the graph; every other
sample fetched for the step is freed. Surplus kept samples are not carried to the next step: they
were sampled from this step's policy (verl's DAPO recipe drops them too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import ExperimentConfig
from realrl.system.buffer import SampleBuffer
from realrl.system.data_feed import DataFeed
from realrl.system.function_call import CallResult
from realrl.system.subgraph import SubgraphExecutor


class DynamicSamplingError(RuntimeError):
    """A step kept fewer samples than a batch after the allowed rounds."""


@dataclasses.dataclass
class SampledStep:
    """One step's sampling rounds, done."""

    kept: list[Hashable]  # the batch the rest of the graph runs on: n_seqs ids
    freed: list[Hashable]  # every other id fetched for the step (dropped, or kept past the batch)
    buffer: SampleBuffer  # the metadata of both, and which workers hold their keys
    results: dict[str, list[CallResult]]  # each sampling call's result, one per round
    epoch: int  # the dataset epoch of the first round's prompts
    rounds: int
    n_kept: int  # kept by the filter over all rounds (>= n_seqs)
    n_dropped: int

    def stats(self, prompt_batches: int) -> dict[str, float]:
        """The step's ``dynamic_sampling/*`` statistics; ``prompt_batches``: batches fetched by
        the run so far, where a resumed run continues in the dataset."""
        seen = self.n_kept + self.n_dropped
        return {
            "dynamic_sampling/rounds": float(self.rounds),
            "dynamic_sampling/kept_groups": float(self.n_kept),
            "dynamic_sampling/dropped_groups": float(self.n_dropped),
            "dynamic_sampling/kept_fraction": self.n_kept / seen,
            "dynamic_sampling/prompt_batches": float(prompt_batches),
        }


class DynamicSampler:
    def __init__(self, config: ExperimentConfig, feed: DataFeed, executor: SubgraphExecutor):
        """``feed``: where the rounds' prompts come from (its position is the run's, resumed with
        it); ``executor``: runs the sampling calls on each step's private buffer."""
        if config.dynamic_sampling is None:
            raise ValueError("DynamicSampler needs ExperimentConfig.dynamic_sampling")
        self.config, self.feed, self.executor = config, feed, executor
        self.mfcs: list[MFCDef] = config.sampling_mfcs()
        self.filter_name = config.dynamic_sampling.filter_mfc
        self.max_rounds = config.dynamic_sampling.max_rounds

    @property
    def prompt_batches(self) -> int:
        """Batches of prompts fetched by the run so far."""
        return self.feed.position

    async def sample(self, step: int) -> SampledStep:
        """Run rounds until a full batch is kept, each on the feed's next batch."""
        cfg = self.config
        buffer = self.executor.buffer(self.mfcs)
        results: dict[str, list[CallResult]] = {m.name: [] for m in self.mfcs}
        kept: list[Hashable] = []
        fetched: list[Hashable] = []
        first_epoch, rounds = None, 0
        while len(kept) < cfg.batch_size:
            if rounds == self.max_rounds:
                raise DynamicSamplingError(
                    f"dynamic sampling: step {step + 1} kept {len(kept)} of the {cfg.batch_size} groups a "
                    f"batch needs after {rounds} rounds of {cfg.batch_size} prompts; the filter "
                    f"{self.filter_name!r} dropped the other {len(fetched) - len(kept)}, whose answers all "
                    "scored the same: the prompts are too easy or too hard for this policy. Raise "
                    "dynamic_sampling.max_rounds, use other data, or turn dynamic sampling off"
                )
            rounds += 1
            epoch, prompts = await self.feed.fetch(step)
            first_epoch = epoch if first_epoch is None else first_epoch
            batch = [sid for _, meta in prompts for sid in meta.ids]
            fetched += batch
            done = await self.executor.run("dynamic sampling", self.mfcs, buffer, prompts, step)
            for name, result in done.items():
                results[name].append(result)
            dropped = set(done[self.filter_name].dropped)
            stray = sorted(map(str, dropped - set(batch)))
            if stray:
                raise RuntimeError(f"{self.filter_name!r} dropped ids {stray[:4]} that are not in its batch")
            kept += [sid for sid in batch if sid not in dropped]
        batch_ids = kept[: cfg.batch_size]
        chosen = set(batch_ids)
        return SampledStep(
            kept=batch_ids,
            freed=[sid for sid in fetched if sid not in chosen],
            buffer=buffer,
            results=results,
            epoch=first_epoch,
            rounds=rounds,
            n_kept=len(kept),
            n_dropped=len(fetched) - len(kept),
        )


def merged_result(results: list[CallResult]) -> CallResult:
    """One call's rounds as one result: statistics averaged (the rounds are equal in size),
    seconds and tokens summed, samples in order; reallocations are recorded per round."""
    keys = sorted({k for r in results for k in r.stats})
    stats = {}
    for k in keys:
        values = [r.stats[k] for r in results if k in r.stats]
        stats[k] = sum(values) / len(values)
    samples = [s for r in results for s in r.samples or []]
    return CallResult(
        ids=[sid for r in results for sid in r.ids],
        stats=stats,
        seconds=sum(r.seconds for r in results),
        n_tokens=sum(r.n_tokens for r in results),
        samples=samples or None,
        peak_memory={w: m for r in results for w, m in r.peak_memory.items()},
    )
