"""Dynamic sampling (DAPO): the sampling calls run in rounds on further prompts until their filter
has kept a full batch; the rest of the graph gets exactly that batch; a step that cannot fill it
stops the run with a named error after ``max_rounds`` rounds instead of looping."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
import torch
from system_graphs import alive, deterministic, mock_config, worker_pids

from realrl.api.core.data_api import SequenceSample
from realrl.api.core.dfg import MFCDef
from realrl.api.core.system_api import DynamicSampling
from realrl.apps.main import ExperimentFailedError, run_experiment
from realrl.system.copies import CopyTracker
from realrl.system.data_feed import DataFeed
from realrl.system.dynamic_sampling import DynamicSampler, DynamicSamplingError
from realrl.system.protocol import FetchReply, MFCReply
from realrl.system.subgraph import SubgraphExecutor
from realrl.system.transfer_plan import TagCounter

# -- the sampler against a fake stream --------------------------------------------------------


def scored_graph(n_seqs: int) -> list[MFCDef]:
    """score -> filter -> train: one worker, so no transfers."""
    return [
        MFCDef("score", "actor", "inference", "sys_test_reward", n_seqs, ("packed_prompts",), ("rewards",)),
        MFCDef("filter", "actor", "inference", "sys_test_drop_multiples", n_seqs, ("rewards",)),
        MFCDef("train", "actor", "train_step", "sys_test_train", n_seqs, ("rewards",)),
    ]


class FakeStream:
    """Answers at once: a fetch with ids ``p<k>`` numbered along the dataset, ``score`` with a
    reward per id, ``filter`` dropping the ids ``drop`` chooses; logs what it was asked."""

    def __init__(self, drop, batch: int):
        self.drop, self.batch = drop, batch
        self.fetches: list[tuple[int, int]] = []  # (epoch, pos)
        self.calls: list[tuple[str, list]] = []

    def post(self, worker, handler, data=None, what=None) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(self._answer(handler, data))
        return fut

    def _answer(self, handler, data):
        if handler == "fetch":
            self.fetches.append((data.epoch, data.pos))
            first = (data.epoch * 100 + data.pos // self.batch) * self.batch
            ids = [f"p{first + i}" for i in range(data.n)]
            meta = SequenceSample.from_default(ids, [2] * data.n, {"packed_prompts": torch.zeros(2 * data.n)})
            return FetchReply(meta.meta(), data.epoch)
        call = data.call
        ids = list(call.input_meta.ids)
        self.calls.append((call.mfc, ids))
        if call.mfc == "score":
            rewards = SequenceSample.from_default(ids, [[1]] * len(ids), {"rewards": torch.zeros(len(ids))})
            return MFCReply(meta=rewards.meta(), stats={"reward": 1.0}, seconds=0.5)
        return MFCReply(stats={"kept": 1.0}, dropped=self.drop(ids), seconds=0.25)


def run_sampler(tmp_path, drop, n_seqs=4, max_rounds=5, steps=1, steps_per_epoch=10, stream=None):
    cfg = mock_config(
        tmp_path,
        "sampler",
        scored_graph(n_seqs),
        {"actor": [0]},
        dynamic_sampling=DynamicSampling("filter", max_rounds),
    )
    stream = stream or FakeStream(drop, n_seqs)
    feed = DataFeed(cfg, stream)  # one shard on worker 0, n_seqs prompts per batch
    feed.steps_per_epoch = steps_per_epoch
    executor = SubgraphExecutor(cfg, stream, TagCounter(), CopyTracker(cfg, TagCounter()))
    sampler = DynamicSampler(cfg, feed, executor)

    async def main():
        return [await sampler.sample(step) for step in range(steps)]

    return asyncio.run(main()), stream, sampler


def number(sid: str) -> int:
    return int(sid[1:])


def test_the_filter_and_its_inputs_run_in_rounds_and_the_first_kept_form_the_batch(tmp_path):
    # keep the ids divisible by 3: p0 p3 | p6 | p9 (4 kept after 3 rounds of 4 prompts), p9 p10 p11 not
    (sampled,), stream, sampler = run_sampler(tmp_path, lambda ids: [s for s in ids if number(s) % 3])
    assert sampled.rounds == 3 and sampled.n_kept == 4 and sampled.n_dropped == 8
    assert sampled.kept == ["p0", "p3", "p6", "p9"]  # in the order the prompts came
    assert sorted(sampled.freed, key=number) == [f"p{i}" for i in range(12) if i % 3]
    assert [name for name, _ in stream.calls] == ["score", "filter"] * 3  # never the training call
    assert stream.fetches == [(0, 0), (0, 4), (0, 8)]  # along the dataset, a batch per round
    assert [len(r.ids) for r in sampled.results["score"]] == [4, 4, 4]
    stats = sampled.stats(sampler.prompt_batches)
    assert stats["dynamic_sampling/rounds"] == 3 and stats["dynamic_sampling/prompt_batches"] == 3
    assert stats["dynamic_sampling/kept_fraction"] == pytest.approx(4 / 12)
    # kept beyond the batch are freed, not carried over: the next step starts on new prompts
    assert sampled.buffer.is_ready(sampled.kept, ["packed_prompts", "rewards"])


def test_surplus_kept_samples_are_freed_and_rounds_continue_into_the_next_epoch(tmp_path):
    # drop p<k> for odd k: 2 kept per round of 4; with 3 batches per epoch the second step's
    # second round takes the next epoch's first batch
    steps, stream, sampler = run_sampler(
        tmp_path, lambda ids: [s for s in ids if number(s) % 2], steps=2, steps_per_epoch=3
    )
    assert [s.rounds for s in steps] == [2, 2]
    assert stream.fetches == [(0, 0), (0, 4), (0, 8), (1, 0)]
    assert steps[1].kept == ["p8", "p10", "p400", "p402"] and steps[1].epoch == 0
    assert sampler.prompt_batches == 4
    # nothing dropped: one round, and the batch is exactly n_seqs
    (one,), _, _ = run_sampler(tmp_path, lambda ids: [], n_seqs=3)
    assert one.rounds == 1 and one.kept == ["p0", "p1", "p2"] and one.freed == []


def test_a_step_that_cannot_fill_its_batch_stops_after_max_rounds(tmp_path):
    with pytest.raises(DynamicSamplingError, match=r"kept 1 of the 4 groups .* after 3 rounds"):
        run_sampler(tmp_path, lambda ids: [s for s in ids if s != "p0"], max_rounds=3)
    everything = FakeStream(lambda ids: ids, batch=4)
    with pytest.raises(
        DynamicSamplingError, match=r"kept 0 of .* after 2 rounds .*dynamic_sampling\.max_rounds"
    ):
        run_sampler(tmp_path, None, max_rounds=2, stream=everything)
    assert len(everything.fetches) == 2  # it stopped asking for prompts


def test_a_filter_that_names_ids_outside_its_batch_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="not in its batch"):
        run_sampler(tmp_path, lambda ids: ["elsewhere"])


def test_the_config_checks_the_filter(tmp_path):
    with pytest.raises(ValueError, match="'nope', not an MFC"):
        mock_config(
            tmp_path, "bad", scored_graph(4), {"actor": [0]}, dynamic_sampling=DynamicSampling("nope")
        )
    with pytest.raises(ValueError, match="max_rounds must be >= 1"):
        mock_config(
            tmp_path, "bad", scored_graph(4), {"actor": [0]}, dynamic_sampling=DynamicSampling("filter", 0)
        )
    graph = scored_graph(4)
    graph[1] = MFCDef("filter", "actor", "inference", "sys_test_drop_multiples", 4, ("rewards", "w"))
    graph[2] = MFCDef("train", "actor", "train_step", "sys_test_train", 4, ("rewards",), ("w",))
    with pytest.raises(ValueError, match=r"depends on the training calls \['train'\]"):
        mock_config(tmp_path, "bad", graph, {"actor": [0]}, dynamic_sampling=DynamicSampling("filter"))
    cfg = mock_config(
        tmp_path, "ok", scored_graph(4), {"actor": [0]}, dynamic_sampling=DynamicSampling("filter")
    )
    assert [m.name for m in cfg.sampling_mfcs()] == ["score", "filter"]


# -- real workers ----------------------------------------------------------------------------


def filtered_graph(modulus: int) -> list[MFCDef]:
    """gen -> values -> reward -> filter (drops dataset indices divisible by ``modulus``) ->
    {census, actor_train}: the PPO shape with a filter, on 2 workers."""

    def mfc(name, role, kind, impl, inputs, outputs=()):
        return MFCDef(name, role, kind, impl, n_seqs=4, input_keys=inputs, output_keys=outputs)

    rollout = ("packed_input_ids", "prompt_mask", "seq_no_eos_mask")
    drop = {"type_": "sys_test_drop_multiples", "args": {"modulus": modulus}}
    from realrl.api.core.config import ModelInterfaceAbstraction

    return [
        mfc("gen", "actor", "generate", "sys_test_gen", ("packed_prompts",), rollout),
        mfc("values", "critic", "inference", "sys_test_values", ("packed_input_ids",), ("values",)),
        mfc("reward", "reward", "inference", "sys_test_reward", ("values",), ("rewards",)),
        mfc("filter", "reward", "inference", ModelInterfaceAbstraction(**drop), ("rewards",)),
        mfc("census", "reward", "inference", "sys_test_census", ("rewards",)),
        mfc("actor_train", "actor", "train_step", "sys_test_train", ("packed_input_ids", "rewards")),
    ]


def refill_config(fileroot, trial: str, steps: int, **kwargs):
    # 16 prompts in 2 shards (the even and the odd indices), 4 batches of 4 per epoch; the filter
    # drops the even ones: 2 rounds per step, and the third step samples from the second epoch
    return mock_config(
        fileroot,
        trial,
        filtered_graph(modulus=2),
        total_train_steps=steps,
        dynamic_sampling=DynamicSampling("filter", max_rounds=2),
        **kwargs,
    )


@pytest.fixture(scope="module")
def refill_run(tmp_path_factory):
    cfg = refill_config(tmp_path_factory.mktemp("refill"), "refill", steps=3)
    return cfg, run_experiment(cfg, "local")


def test_workers_refill_the_batch_with_further_prompts(refill_run):
    cfg, stats = refill_run
    assert [s["step"] for s in stats] == [1, 2, 3]
    assert [s["epoch"] for s in stats] == [1, 1, 2]
    for s in stats:
        assert s["dynamic_sampling/rounds"] == 2.0 and s["dynamic_sampling/kept_groups"] == 4.0
        assert s["dynamic_sampling/dropped_groups"] == 4.0 and s["filter/seen"] == 4.0
        assert s["census/n"] == 4.0 and s["census/odd"] == 4.0  # a full batch of kept prompts only
        assert s["actor_train/n_seqs"] == 4.0  # both dp ranks together trained on the batch
        assert {"gen", "values", "reward", "filter", "census", "actor_train"} == set(s["timing"])
    assert [s["dynamic_sampling/prompt_batches"] for s in stats] == [2.0, 4.0, 6.0]
    with open(os.path.join(cfg.run_dir, "stats.jsonl")) as f:
        assert [json.loads(line)["dynamic_sampling/rounds"] for line in f] == [2.0] * 3
    for w in (0, 1):  # the dropped prompts' tensors were freed too
        with open(os.path.join(cfg.log_dir, f"model_worker-{w}.log")) as f:
            assert "exits as asked (0 live samples)" in f.read()


def test_a_resumed_run_continues_where_the_prompts_stopped(refill_run, tmp_path):
    _, uninterrupted = refill_run
    first = refill_config(tmp_path, "resume", steps=2, ckpt_freq_steps=2)
    run_experiment(first, "local")
    # the position along the dataset is the recover point's, not read back from the records
    with open(os.path.join(first.run_dir, "recover", "step2", "master.json")) as f:
        assert json.load(f) == {"feed": {"position": 4}}
    stats_path = os.path.join(first.run_dir, "stats.jsonl")
    with open(stats_path) as f:
        records = [json.loads(line) for line in f]
    with open(stats_path, "w") as f:
        f.writelines(
            json.dumps({k: v for k, v in r.items() if "prompt_batches" not in k}) + "\n" for r in records
        )
    resumed = run_experiment(refill_config(tmp_path, "resume", steps=3, resume=True), "local")
    assert [s["step"] for s in resumed] == [3]
    assert deterministic(resumed) == deterministic(uninterrupted)[2:]  # the same third batch
    assert resumed[0]["dynamic_sampling/prompt_batches"] == 6.0 and resumed[0]["epoch"] == 2


def test_a_run_whose_groups_are_all_uniform_stops_with_the_named_error(tmp_path):
    cfg = mock_config(
        tmp_path,
        "uniform",
        filtered_graph(modulus=1),
        total_train_steps=2,
        dynamic_sampling=DynamicSampling("filter", max_rounds=3),
    )
    with pytest.raises(ExperimentFailedError, match=r"step 1 kept 0 of the 4 groups .* after 3 rounds"):
        run_experiment(cfg, "local")
    assert alive(worker_pids(cfg).values()) == []
