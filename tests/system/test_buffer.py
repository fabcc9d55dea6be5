"""The master's sample buffer, transfer planning, and the worker's tensor store."""

from __future__ import annotations

import asyncio
import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from realrl.api.core.data_api import SequenceSample
from realrl.base.network import find_free_port
from realrl.system.buffer import SampleBuffer
from realrl.system.data_transfer import TensorStore, run_transfers
from realrl.system.transfer_plan import TransferPiece, plan_transfers


def batch(ids, lens, key="packed_prompts", start=0):
    tokens = torch.arange(start, start + sum(lens))
    return SequenceSample.from_default(ids, lens, {key: tokens})


def outputs(ids, lens, value=1.0):
    return SequenceSample.from_default(ids, lens, {"values": torch.full((sum(lens),), value)})


def test_an_mfc_fires_on_the_first_n_untaken_ids_once_they_hold_its_keys():
    async def main():
        buf = SampleBuffer(["gen", "inf"])
        buf.add(batch(["a", "b", "c"], [2, 3, 4]).meta(), owner=0, step=0)
        assert await buf.take("gen", ["packed_prompts"], 2) == ["a", "b"]
        assert await buf.take("gen", ["packed_prompts"], 1) == ["c"]
        assert buf.next_ids("gen", 1) is None  # everything taken by gen
        waiter = asyncio.ensure_future(buf.take("inf", ["packed_prompts", "values"], 2))
        await asyncio.sleep(0.01)
        buf.update(outputs(["b"], [3]).meta(), owner=1)  # b is ready but a is not: arrival order wins
        await asyncio.sleep(0.01)
        assert not waiter.done()
        buf.update(outputs(["a"], [2]).meta(), owner=1)
        assert await asyncio.wait_for(waiter, 1) == ["a", "b"]
        assert buf.owners("a", "values") == {1} and buf.owners("a", "packed_prompts") == {0}
        buf.add_owner(["a"], ["packed_prompts"], 1)
        assert buf.owners("a", "packed_prompts") == {0, 1}
        with pytest.raises(KeyError, match="not ready"):
            buf.owners("c", "values")
        assert buf.finish("gen", ["a", "b", "c"]) == []  # inf has not finished them
        assert buf.finish("inf", ["a", "b"]) == ["a", "b"]
        assert list(buf.entries) == ["c"]
        with pytest.raises(ValueError, match="already live"):
            buf.add(batch(["c"], [1]).meta(), owner=0, step=1)

    asyncio.run(main())


def test_gather_meta_keeps_lengths_and_refuses_tensors():
    buf = SampleBuffer(["x"])
    with pytest.raises(ValueError, match="metadata only"):
        buf.add(batch(["a"], [2]), owner=0, step=0)
    buf.add(batch(["a", "b"], [2, 5]).meta(), owner=0, step=0)
    buf.update(outputs(["a", "b"], [2, 5]).meta(), owner=1)
    meta = buf.gather_meta(["b", "a"], ["values"])
    assert meta.ids == ["b", "a"] and meta.seqlens["values"] == [[5], [2]] and meta.data is None


def test_plan_transfers_skips_what_the_destination_holds_and_groups_by_source():
    buf = SampleBuffer(["x"])
    buf.add(batch(["a", "b"], [2, 3]).meta(), owner=0, step=0)
    buf.add(batch(["c"], [4]).meta(), owner=1, step=0)
    buf.add_owner(["b"], ["packed_prompts"], 2)
    pieces = plan_transfers(buf, ["a", "b", "c"], ["packed_prompts"], dst=2, first_tag=10)
    assert [(p.src, p.ids, p.rows, p.tag) for p in pieces] == [(0, ["a"], 2, 10), (1, ["c"], 4, 11)]
    assert plan_transfers(buf, ["a"], ["packed_prompts"], dst=0, first_tag=0) == []


def test_tensor_store_assembles_and_drops():
    store = TensorStore()
    store.put(batch(["a", "b"], [2, 3]))
    meta = batch(["b", "a"], [3, 2]).meta()
    data = store.assemble(meta)
    assert data.data["packed_prompts"].tolist() == [2, 3, 4, 0, 1]
    assert store.drop(["a", "zz"]) == 1
    with pytest.raises(KeyError, match="holds no 'packed_prompts'"):
        store.get(["a"], "packed_prompts")


def _exchange(rank: int, port: int, result_dir: str) -> None:
    """Two workers swap pieces in both directions at once (int, bool and float keys)."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=30),
    )
    store = TensorStore()
    mine = SequenceSample.from_default(
        [f"{rank}a", f"{rank}b"],
        [2, 3],
        {
            "packed_input_ids": torch.arange(5) + 100 * rank,
            "prompt_mask": torch.tensor([True, False, True, True, False]),
            "rewards": torch.tensor([rank + 0.5, rank + 0.25]),
        },
    )
    store.put(mine)
    pieces = []
    for src in (0, 1):
        for key, lens, dtype in [
            ("packed_input_ids", [[2], [3]], "int64"),  # dtype names, as the master plans them
            ("prompt_mask", [[2], [3]], "bool"),
            ("rewards", [[1], [1]], "float32"),
        ]:
            pieces.append(
                TransferPiece(src, 1 - src, key, [f"{src}a", f"{src}b"], lens, dtype, (), len(pieces))
            )
    run_transfers(store, pieces, rank, timeout=30)
    other = 1 - rank
    got = {
        k: store.get([f"{other}a", f"{other}b"], k) for k in ("packed_input_ids", "prompt_mask", "rewards")
    }
    torch.save(got, os.path.join(result_dir, f"{rank}.pt"))
    dist.destroy_process_group()


def test_run_transfers_moves_pieces_both_ways_over_gloo(tmp_path):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # fork: the children reuse this process's imports (spawning two fresh Pythons costs ~10 s here)
    mp.start_processes(_exchange, args=(find_free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"{rank}.pt")
        other = 1 - rank
        assert got["packed_input_ids"].tolist() == [100 * other + i for i in range(5)]
        assert got["prompt_mask"].dtype == torch.bool
        assert got["prompt_mask"].tolist() == [True, False, True, True, False]
        assert got["rewards"].tolist() == [other + 0.5, other + 0.25]


def test_frees_go_to_the_workers_holding_a_key_of_each_sample_only():
    buf = SampleBuffer(["gen", "train"])
    buf.add(batch(["a", "b"], [2, 3]).meta(), owner=0, step=0)
    buf.add(batch(["c"], [4]).meta(), owner=1, step=0)
    buf.update(outputs(["a"], [2]).meta(), owner=2)  # a's values live on worker 2 only
    buf.add_owner(["b"], ["packed_prompts"], 3)  # worker 3 received a copy of b
    assert buf.release("gen", ["a", "b", "c"]) == {}  # train still reads them: nothing freed
    assert buf.holders(["a", "b", "c"]) == {0: ["a", "b"], 1: ["c"], 2: ["a"], 3: ["b"]}
    assert buf.release("train", ["a", "b"]) == {0: ["a", "b"], 2: ["a"], 3: ["b"]}  # never worker 1
    assert list(buf.entries) == ["c"]
