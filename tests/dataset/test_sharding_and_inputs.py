"""Deterministic data-parallel sharding, and every input kind through a registered dataset."""

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realrl.api.core.config import DatasetAbstraction
from realrl.api.core.data_api import make_dataset
from realrl.impl.dataset.collators import DataCollatorForPreference
from realrl.impl.dataset.samples import pairs_of
from realrl.impl.dataset.sharding import shard_indices


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 200), world=st.integers(1, 8), seed=st.integers(0, 2**40))
def test_shards_are_disjoint_balanced_and_deterministic(n, world, seed):
    shards = [shard_indices(n, r, world, seed) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert shards == [shard_indices(n, r, world, seed) for r in range(world)]
    assert all(s == sorted(s) for s in shards)


def test_bad_rank():
    with pytest.raises(ValueError, match="dp_rank 2 out of range"):
        shard_indices(10, 2, 2, 0)


ROWS = [{"prompt": "Q ", "chosen": f"yes {i}", "rejected": f"no {i}", "margin": float(i)} for i in range(4)]


def _source(tmp_path, kind):
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
        return str(tmp_path / "d.parquet")
    if kind == "save_to_disk":
        datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
        return str(tmp_path / "saved")
    if kind == "hf_dataset":
        return datasets.Dataset.from_list(ROWS)
    return ROWS


@pytest.mark.parametrize("kind", ["parquet", "save_to_disk", "hf_dataset", "list"])
def test_rw_paired_from_every_input_kind(tmp_path, tokenizer, kind):
    cfg = DatasetAbstraction("rw_paired", {"dataset_path": _source(tmp_path, kind), "max_length": 64})
    ds = make_dataset(cfg, seed=0, dp_rank=0, world_size=1, tokenizer_or_tokenizer_name=tokenizer)
    assert [s.ids[0] for s in ds.samples] == [0, 1, 2, 3]
    ((c, r),) = pairs_of(ds[2])
    assert (
        c == tokenizer("Q yes 2<|endoftext|>")["input_ids"]
        and r == tokenizer("Q no 2<|endoftext|>")["input_ids"]
    )
    assert ds[2].data["margins"].tolist() == [2.0, 2.0]


def test_collator_rejects_other_tensor_types():
    with pytest.raises(ValueError, match="return_tensors"):
        DataCollatorForPreference(pad_token_id=0, return_tensors="np")
    with pytest.raises(ValueError, match="neither chosen_ids"):
        DataCollatorForPreference(pad_token_id=0)([{"chosen": [1]}])
