"""The data feed: the one way the master fetches prompts (or any dataset batch) from the workers
that hold the dataset's shards.

It owns the shards' owners and how many samples each gives per batch, the steps per epoch, and
its position along the dataset: the number of batches fetched so far. A batch at position p is
the slice ``p % steps_per_epoch`` of epoch ``p // steps_per_epoch`` of each shard; the main loop
fetches one batch per step (position = step), dynamic sampling as many as its rounds need, so the
feed remembers the position each step ended at and a recover point stores it (``state``).
Evaluation's held-out prompts come through here too (``eval_batch``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.system_api import ExperimentConfig, model_worker_name
from realrl.system.function_call import post_all
from realrl.system.progress import Progress
from realrl.system.protocol import FetchEvalRequest, FetchRequest
from realrl.system.request_reply_stream import MasterStream, wait_replies

Batch = list[tuple[int, SequenceSample]]  # (owner, metadata of its share), in owner order


class DataFeed:
    def __init__(self, config: ExperimentConfig, stream: MasterStream):
        self.config, self.stream = config, stream
        self.owners = config.data_workers()
        n, dp = config.batch_size, len(self.owners)
        self.counts = [n // dp + (r < n % dp) for r in range(dp)]  # samples per owner per batch
        self.steps_per_epoch = 0
        self.position = 0  # batches fetched so far
        self.positions: dict[int, int] = {}  # step -> the position after its last batch

    def set_sizes(self, sizes: list[int]) -> None:
        """The shards' sizes (one per owner, from the workers' setup replies)."""
        self.steps_per_epoch = min(s // n for s, n in zip(sizes, self.counts))
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"dataset shards have {sizes} samples but each step takes {self.counts} from them "
                f"(n_seqs={self.config.batch_size}); use a larger dataset or a smaller n_seqs"
            )

    # -- the position, in recover points ------------------------------------------------------------

    def start_at(self, step: int, state: dict | None) -> None:
        """A run resumed after ``step`` steps continues where the recover point's feed stopped (one
        batch per step when the point has no feed state)."""
        self.position = int(state["position"]) if state else step

    def state(self, steps_done: int) -> dict:
        """What a recover point after ``steps_done`` steps keeps of the feed."""
        return {"position": self.positions.get(steps_done - 1, steps_done)}

    # -- fetching ---------------------------------------------------------------------------------

    def post(self, step: int) -> tuple[int, dict[int, asyncio.Future]]:
        """Post the fetches of the next batch, for ``step``, without waiting; its epoch (0-based)
        and each owner's reply future."""
        epoch, index = divmod(self.position, self.steps_per_epoch)
        futures = {
            w: self.stream.post(
                model_worker_name(w),
                "fetch",
                FetchRequest(n, step, epoch, index * n),
                f"fetching the dataset batch of step {step}",
            )
            for w, n in zip(self.owners, self.counts)
        }
        self.position += 1
        self.positions[step] = self.position
        return epoch, futures

    async def collect(self, futures: dict[int, asyncio.Future]) -> Batch:
        replies = await wait_replies(futures, model_worker_name, "fetch", self.config.timeouts.request)
        return [(w, replies[w].meta) for w in self.owners]

    async def fetch(self, step: int) -> tuple[int, Batch]:
        """The next batch, for ``step``: its epoch and each owner's share."""
        epoch, futures = self.post(step)
        return epoch, await self.collect(futures)

    async def load(
        self, progress: Progress, live_steps: int, start: int, on_batch: Callable[[int, int, Batch], None]
    ) -> None:
        """The main loop's batches, one per step from ``start``: the fetches are posted up to
        ``live_steps`` ahead of the last finished step without waiting for each reply (a fetch
        waits in the data worker's queue behind the call it is running), and ``on_batch(step,
        epoch, batch)`` gets them in step order as their replies come (a failure of either half
        fails this task, and so the run)."""
        fetches: asyncio.Queue = asyncio.Queue()

        async def post_fetches() -> None:
            for step in range(start, progress.total_steps):
                await progress.wait_for(lambda s=step: s - progress.steps_done < live_steps)
                fetches.put_nowait((step, *self.post(step)))
            fetches.put_nowait(None)

        async def collect_batches() -> None:
            while (item := await fetches.get()) is not None:
                step, epoch, futures = item
                on_batch(step, epoch, await self.collect(futures))

        await asyncio.gather(post_fetches(), collect_batches())

    async def eval_batch(self, step: int) -> Batch:
        """The held-out prompts of an RL run's evaluation after ``step`` (on the first owner)."""
        owner = self.owners[0]
        reply = await post_all(
            self.stream, {owner: FetchEvalRequest(step)}, "fetch_eval", self.config.timeouts.request
        )
        return [(owner, reply[owner].meta)]
