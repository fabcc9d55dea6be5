"""What asynchronous RL changes in how the master moves weights and data: weight pushes after each
training call, received by the generation copy's next call; the rule that makes a run
reproducible (a training call waits for the generate calls that must sample the version before
it); outputs pushed to the workers that read them, received whole; sends nobody waits for."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from system_graphs import mock_config

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.system_api import AsyncRL
from realrl.system.buffer import Push, SampleBuffer
from realrl.system.copies import CopyTracker
from realrl.system.data_transfer import PendingSends
from realrl.system.master_worker import MasterWorker
from realrl.system.transfer_plan import TagCounter, plan_pushes, plan_transfers, push_targets
from realrl.system.version_rule import VersionRule

GEN = Placement(Layout(2, 1, 1), (2, 3))  # the actor's home is d2 on workers 0 and 1


def _tracker(tmp_path, staleness: int = 1, gen: Placement = GEN, **kw):
    cfg = mock_config(tmp_path, "t", mfc_placements={"gen": gen}, async_rl=AsyncRL(staleness), **kw)
    return CopyTracker(cfg, TagCounter()), {m.name: m for m in cfg.mfcs}


def test_each_training_call_pushes_the_version_the_copys_next_call_receives(tmp_path):
    tracker, mfc = _tracker(tmp_path)
    first = tracker.plan(mfc["gen"], 0)
    assert first.realloc and first.receives == ()  # the first fill is a reallocation
    assert not tracker.plan(mfc["gen"], 1).realloc  # version 0 serves steps 0 and 1 (staleness 1)
    assert tracker.plan(mfc["actor_train"], 0) is None
    (push,) = tracker.weight_pushes(mfc["actor_train"], total_steps=4)
    assert (push.version, push.src.workers, push.dst) == (1, (0, 1), GEN)
    assert tracker.weight_pushes(mfc["gen"], total_steps=4) == []  # only training calls push
    second = tracker.plan(mfc["gen"], 2)
    assert second.receives == (push,) and not second.realloc and second.version == 1
    assert tracker.plan(mfc["gen"], 3).receives == ()  # each push is received once
    assert tracker.versions_used == {("gen", 0): 0, ("gen", 1): 0, ("gen", 2): 1, ("gen", 3): 1}
    tracker.plan(mfc["actor_train"], 1)
    tracker.plan(mfc["actor_train"], 2)
    # version 2 serves step 3; version 3 would serve step 4, past the run: not pushed
    assert [p.version for p in tracker.weight_pushes(mfc["actor_train"], total_steps=4)] == []


def test_a_piece_receives_only_the_versions_whose_training_is_done(tmp_path):
    tracker, mfc = _tracker(tmp_path)
    tracker.plan(mfc["gen"], 0)
    tracker.plan(mfc["actor_train"], 0)
    (push,) = tracker.weight_pushes(mfc["actor_train"], total_steps=10)
    still_training = tracker.plan_continue(mfc["gen"], finished=0)
    assert still_training.receives == () and not still_training.realloc and still_training.version == 0
    done = tracker.plan_continue(mfc["gen"], finished=1)
    assert done.receives == (push,) and not done.realloc and done.version == 1


def test_no_pushes_to_a_copy_sharing_workers_with_home(tmp_path):
    overlapping, mfc = _tracker(tmp_path, gen=Placement(Layout(2, 1, 1), (1, 2)))
    assert overlapping.push_placements("actor") == []
    on_gpus, _ = _tracker(tmp_path, device="cuda")  # NCCL pushes as gloo does (test_nccl_pushes.py)
    assert on_gpus.push_placements("actor") == [GEN]
    overlapping.plan(mfc["gen"], 0)
    overlapping.plan(mfc["actor_train"], 0)
    assert overlapping.weight_pushes(mfc["actor_train"], total_steps=10) == []
    assert overlapping.plan(mfc["gen"], 2).realloc  # an ordinary reallocation instead


def test_a_training_call_waits_until_the_generate_calls_of_older_versions_are_posted(tmp_path):
    cfg = mock_config(tmp_path, "t", async_rl=AsyncRL(2))
    rule, mfc = VersionRule(cfg), {m.name: m for m in cfg.mfcs}
    done = dict.fromkeys(mfc, 0)
    # training step 0 makes version 1: first the calls of steps 0..2 must have taken version 0
    assert not rule.ready(mfc["actor_train"], 0, done, {**done, "gen": 2}, total_steps=10)
    assert rule.ready(mfc["actor_train"], 0, done, {**done, "gen": 3}, total_steps=10)
    assert rule.ready(mfc["actor_train"], 0, done, {**done, "gen": 2}, total_steps=2)  # the run's end
    assert rule.ready(mfc["critic_train"], 0, done, done, total_steps=10)  # its model generates nothing
    sync = VersionRule(mock_config(tmp_path, "s"))
    assert sync.ready(mfc["actor_train"], 0, done, done, total_steps=10)


def test_outputs_are_pushed_to_the_workers_of_readers_taking_every_sample(tmp_path):
    cfg = mock_config(tmp_path, "t", mfc_placements={"gen": GEN}, async_rl=AsyncRL(1))
    targets = push_targets(cfg)
    # values (critic, worker 1) reads the answers; actor_train (d2) reads only its share: not pushed to
    assert targets["gen"]["packed_input_ids"] == [1]
    assert targets["values"]["values"] == [0, 1]  # reward on 0, critic_train on 1
    orders = plan_pushes(targets["values"], [([1], ["a", "b"])], first_tag=40)
    assert [(src, o.key, o.ids, o.dst, o.tag) for src, o in orders] == [(1, "values", ["a", "b"], 0, 40)]
    # a d2 producer: each replica's part goes to the reader on the other replica's worker
    orders = plan_pushes({"k": [0, 1]}, [([0], ["a"]), ([1], ["b"])], first_tag=0)
    assert [(src, o.ids, o.dst) for src, o in orders] == [(0, ["a"], 1), (1, ["b"], 0)]


def _buffer() -> SampleBuffer:
    buffer = SampleBuffer(["reader"])
    data = {"values": torch.zeros(5)}
    buffer.add(SequenceSample.from_default(["a", "b"], [2, 3], data).meta(), owner=2, step=0)
    return buffer


def test_a_pushed_key_is_received_whole_by_the_first_call_reading_it():
    buffer = _buffer()
    buffer.expect_push(Push(2, ("a", "b"), 77), "values", dst=0)
    (piece,) = plan_transfers(buffer, ["a"], ["values"], dst=0, first_tag=10)
    assert (piece.src, piece.ids, piece.tag, piece.pushed, piece.rows) == (2, ["a", "b"], 77, True, 5)
    assert buffer.owners("b", "values") == {2}  # planning only reads the buffer
    buffer.receive_pushes([piece])  # the dispatcher reports the plan it posted
    assert buffer.owners("b", "values") == {0, 2}  # received with "a": nothing more to move
    assert plan_transfers(buffer, ["b"], ["values"], dst=0, first_tag=20) == []
    (fetched,) = plan_transfers(buffer, ["a"], ["values"], dst=1, first_tag=30)  # no push to 1
    assert (fetched.src, fetched.pushed, fetched.tag) == (0, False, 30)


class _Work:
    def __init__(self, done: bool):
        self.done = done
        self.waited = False

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout=None) -> bool:
        self.waited = True
        return True


def test_pending_sends_are_forgotten_once_received_and_an_overdue_one_is_named():
    sends = PendingSends(timeout=30.0)
    done, pending = _Work(True), _Work(False)
    sends.add(done, torch.zeros(1), "'values' of 2 samples", 0)
    sends.add(pending, torch.zeros(1), "actor version 3", 1)
    sends.reap()
    assert len(sends) == 1 and done.waited
    overdue = PendingSends(timeout=0.0)
    overdue.add(_Work(False), torch.zeros(1), "actor version 3", 1)
    with pytest.raises(TimeoutError, match="actor version 3 to worker 1"):
        overdue.reap()
    sends.wait_all()
    assert len(sends) == 0 and pending.waited


def test_waiting_for_a_call_whose_data_only_workers_replied_does_not_spin():
    """A worker that only sent data replies at once; waiting on its done reply again would end
    every wait immediately and spin the master's CPU until the computing worker replies."""

    class Master:  # the parts of the master the wait uses
        def __init__(self):
            self.buffer, self.checks = SampleBuffer(["m"]), 0

        def _ready_inputs(self, mfc, step):
            self.checks += 1
            return None

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        sender, computer = loop.create_future(), loop.create_future()
        sender.set_result(None)
        loop.call_later(0.2, computer.set_result, None)
        posted = dataclasses.make_dataclass("Posted", ["futures"])({0: sender, 1: computer})
        master = Master()
        ids = await MasterWorker._inputs_before_reply(master, None, 0, posted)
        assert ids is None
        return master.checks

    assert asyncio.run(scenario()) <= 2
