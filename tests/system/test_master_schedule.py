"""The master's scheduling against one in-process fake worker that answers in order, as a real
one does: a training call fed by the dataset is posted before the previous one has replied (the
worker never waits for the master between steps), but never across a checkpoint."""

from __future__ import annotations

import asyncio
import collections
import os

import torch
from system_graphs import mock_config

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.dfg import MFCDef
from realrl.system.master_worker import MasterWorker
from realrl.system.protocol import FetchReply, MFCReply, SetupReply


class InOrderWorker:
    """A MasterStream stand-in: one worker that runs the requests it was sent one after the
    other. For every call it finishes it notes whether the next call was already waiting."""

    def __init__(self, dataset_size: int, call_seconds: float = 0.05):
        # call_seconds: the master's own work between calls must fit in it, also on a loaded
        # machine (10 ms was once too little under 14 parallel test processes)
        self.dataset_size, self.call_seconds = dataset_size, call_seconds
        self.inbox: collections.deque = collections.deque()
        self.arrived = asyncio.Event()
        self.handled: list[str] = []
        self.next_call_waiting: list[bool] = []  # per finished call
        self.address = "fake"

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._work())

    def close(self) -> None:
        self.task.cancel()

    async def wait_hello(self, workers, timeout, check=None) -> None:
        return None

    def silent_workers(self, names, limit):
        return []

    def post(self, worker: str, handler: str, data=None, what=None) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.inbox.append((handler, data, fut))
        self.arrived.set()
        return fut

    async def _work(self) -> None:
        while True:
            while not self.inbox:
                self.arrived.clear()
                await self.arrived.wait()
            handler, data, fut = self.inbox.popleft()
            self.handled.append(handler)
            fut.set_result(await self._answer(handler, data))

    async def _answer(self, handler: str, data):
        if handler == "setup":
            return SetupReply(self.dataset_size)
        if handler == "fetch":
            ids = [f"s{data.epoch}-{data.pos + i}" for i in range(data.n)]
            batch = SequenceSample.from_default(
                ids=ids,
                seqlens=[3] * data.n,
                data={"packed_input_ids": torch.zeros(3 * data.n, dtype=torch.long)},
            )
            return FetchReply(batch.meta(), data.epoch)
        if handler == "mfc":
            await asyncio.sleep(self.call_seconds)
            self.next_call_waiting.append(any(h == "mfc" for h, _, _ in self.inbox))
            return MFCReply(stats={"loss": 1.0})
        if handler == "save":
            os.makedirs(data.path, exist_ok=True)  # where the master marks recover points
        return None  # initialize, clear, save


def run_master(tmp_path, steps: int, **cfg_kwargs) -> InOrderWorker:
    train = MFCDef(
        "train", "actor", "train_step", "sys_test_train", n_seqs=2, input_keys=("packed_input_ids",)
    )
    cfg = mock_config(tmp_path, "schedule", [train], {"actor": [0]}, total_train_steps=steps, **cfg_kwargs)
    cfg.datasets[0].args["n"] = 64
    os.makedirs(cfg.run_dir, exist_ok=True)  # what run_experiment does before the master starts

    async def main() -> InOrderWorker:
        worker = InOrderWorker(dataset_size=64)
        stats = await MasterWorker(cfg, worker).run()
        worker.close()
        assert [s["step"] for s in stats] == list(range(1, steps + 1))
        return worker

    return asyncio.run(main())


def test_the_next_dataset_fed_call_is_queued_before_the_current_one_ends(tmp_path):
    worker = run_master(tmp_path, steps=8)
    # from the second call on, every call but the last found the next one waiting: no round trip
    # to the master between them (the first goes out before the second batch is in the buffer)
    assert worker.next_call_waiting[1:] == [True] * 6 + [False]
    assert worker.handled.count("fetch") == 8


def test_no_call_is_queued_across_a_checkpoint(tmp_path):
    worker = run_master(tmp_path, steps=6, ckpt_freq_steps=2)
    # after steps 2, 4 and 6 a recover point is written before the next call may go out
    assert worker.next_call_waiting[1:] == [False, True, False, True, False]
    assert worker.handled.count("save") == 3 + 1  # recover points at 2, 4, 6 and the final HF save
