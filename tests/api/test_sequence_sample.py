import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realrl.api.core import data_api
from realrl.api.core.data_api import MicroBatchSpec, SequenceSample


@st.composite
def samples(draw, max_bs=12):
    """Random batches with per-token, token-minus-one and per-sequence keys, 1-3 sequences each."""
    bs = draw(st.integers(1, max_bs))
    rows = [draw(st.lists(st.integers(1, 20), min_size=1, max_size=3)) for _ in range(bs)]
    total = sum(sum(r) for r in rows)
    n_seq = sum(len(r) for r in rows)
    ids = [f"s{i}" for i in draw(st.permutations(range(bs)))]
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    data = {
        "packed_input_ids": torch.randint(0, 100, (total,), generator=g),
        "packed_logprobs": torch.randn(total - n_seq, generator=g),
        "rewards": torch.randn(n_seq, generator=g),
    }
    return SequenceSample.from_default(ids, rows, data, metadata={"tag": list(range(bs))})


@given(samples())
@settings(max_examples=100, deadline=None)
def test_gather_of_unpack_is_identity(x):
    parts = x.unpack()
    assert [p.bs for p in parts] == [1] * x.bs
    assert SequenceSample.gather(parts) == x


@given(samples(), st.integers(1, 6), st.one_of(st.none(), st.integers(1, 60)))
@settings(max_examples=150, deadline=None)
def test_split_pieces_concatenate_back_and_respect_budget(x, n_mbs, budget):
    pieces = x.split(MicroBatchSpec(n_mbs=n_mbs, max_tokens_per_mb=budget))
    assert SequenceSample.gather(pieces) == x
    assert len(pieces) >= min(n_mbs, x.bs)
    for p in pieces:
        tokens = sum(p.token_counts())
        assert budget is None or tokens <= budget or p.bs == 1


@given(samples())
@settings(max_examples=30, deadline=None)
def test_pickle_round_trip(x):
    assert pickle.loads(pickle.dumps(x)) == x
    assert pickle.loads(pickle.dumps(x.meta())) == x.meta()


def test_from_default_follows_key_specs():
    x = SequenceSample.from_default(
        ids=[0, 1],
        seqlens=[5, [3, 4]],
        data={
            "packed_input_ids": torch.arange(12),
            "packed_logprobs": torch.zeros(12 - 3),
            "seq_no_eos_mask": torch.tensor([True, False, False]),
        },
    )
    assert x.seqlens["packed_input_ids"] == [[5], [3, 4]]
    assert x.seqlens["packed_logprobs"] == [[4], [2, 3]]
    assert x.seqlens["seq_no_eos_mask"] == [[1], [1, 1]]
    assert x.cu_seqlens("packed_input_ids").tolist() == [0, 5, 8, 12]
    assert x.bs == 2


def test_from_default_unknown_key_names_it():
    with pytest.raises(ValueError, match="'mystery'.*register_key_spec"):
        SequenceSample.from_default([0], [3], {"mystery": torch.zeros(3)})


def test_register_key_spec_for_plugin_keys():
    data_api.register_key_spec("test_plugin_score", "sequence", torch.float32)
    x = SequenceSample.from_default([0, 1], [[2, 2], 3], {"test_plugin_score": torch.zeros(3)})
    assert x.seqlens["test_plugin_score"] == [[1, 1], [1]]
    with pytest.raises(ValueError, match="already registered"):
        data_api.register_key_spec("test_plugin_score", "token", torch.float32)


def _sample(**overrides):
    kwargs = dict(
        keys={"packed_input_ids"},
        trailing_shapes={"packed_input_ids": ()},
        dtypes={"packed_input_ids": torch.long},
        ids=["a", "b"],
        seqlens={"packed_input_ids": [[2], [3]]},
        data={"packed_input_ids": torch.arange(5)},
    )
    kwargs.update(overrides)
    return SequenceSample(**kwargs)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(ids=["a", "a"]), "unique"),
        (dict(seqlens={"packed_input_ids": [[2]]}), "'packed_input_ids'.*1 samples but there are 2"),
        (dict(data={"packed_input_ids": torch.arange(6)}), "'packed_input_ids'.*6 rows but seqlens sum to 5"),
        (dict(data={"packed_input_ids": torch.zeros(5)}), "'packed_input_ids'.*dtype"),
        (
            dict(data={"packed_input_ids": torch.zeros(5, 2, dtype=torch.long)}),
            "'packed_input_ids'.*trailing shape",
        ),
        (dict(dtypes={}), "dtypes.*missing: \\['packed_input_ids'\\]"),
        (dict(data={"other": torch.arange(5)}), "data keys"),
        (dict(seqlens={"packed_input_ids": [[2], [-1]]}), "negative"),
        (dict(metadata={"m": [1]}), "metadata 'm'"),
    ],
)
def test_inconsistent_samples_raise_naming_the_problem(overrides, message):
    with pytest.raises(ValueError, match=message):
        _sample(**overrides)


def test_gather_errors_name_the_key():
    a = _sample()
    b = _sample(
        ids=["c", "d"],
        dtypes={"packed_input_ids": torch.int32},
        data={"packed_input_ids": torch.arange(5, dtype=torch.int32)},
    )
    with pytest.raises(ValueError, match="'packed_input_ids' has different dtypes"):
        SequenceSample.gather([a, b])
    with pytest.raises(ValueError, match="unique"):
        SequenceSample.gather([a, _sample()])
    with pytest.raises(ValueError, match="lacks keys"):
        SequenceSample.gather([a, _sample(ids=["c", "d"])], keys=["packed_input_ids", "rewards"])
    with pytest.raises(ValueError, match="mix"):
        SequenceSample.gather([a, _sample(ids=["c", "d"]).meta()])


def test_select_update_remap_meta_to():
    x = SequenceSample.from_default(
        ["a", "b"],
        [3, 2],
        {"packed_input_ids": torch.arange(5), "prompt_mask": torch.zeros(5, dtype=torch.bool)},
    )
    y = x.select(["packed_input_ids"])
    assert y.keys == {"packed_input_ids"} and x.keys == {"packed_input_ids", "prompt_mask"}
    r = SequenceSample.from_default(["a", "b"], [3, 2], {"rewards": torch.tensor([1.0, 2.0])})
    y.update_(r)
    assert y.keys == {"packed_input_ids", "rewards"}
    assert torch.equal(y.data["rewards"], torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="ids differ"):
        y.update_(SequenceSample.from_default(["b", "a"], [3, 2], {"rewards": torch.tensor([1.0, 2.0])}))
    y.remap_keys_({"rewards": "scores"})
    assert y.keys == {"packed_input_ids", "scores"} and y.seqlens["scores"] == [[1], [1]]
    with pytest.raises(ValueError, match="two keys to one"):
        y.remap_keys_({"scores": "packed_input_ids"})
    m = y.meta()
    assert m.data is None and m.seqlens == y.seqlens and y.data is not None
    assert y.to("cpu").data["scores"].device.type == "cpu"


def test_split_with_lengths_and_balance():
    x = SequenceSample.from_default(
        list(range(6)), [10, 1, 1, 1, 1, 10], {"packed_input_ids": torch.arange(24)}
    )
    parts = x.split_with_lengths([2, 4])
    assert [p.ids for p in parts] == [[0, 1], [2, 3, 4, 5]]
    with pytest.raises(ValueError):
        x.split_with_lengths([2, 2])
    pieces = x.split(MicroBatchSpec(n_mbs=2))
    assert [sum(p.token_counts()) for p in pieces] == [12, 12]
    assert len(x.split(MicroBatchSpec(n_mbs=10))) == 6  # never an empty piece


def test_micro_batch_spec_validation():
    with pytest.raises(ValueError, match="n_mbs"):
        MicroBatchSpec(n_mbs=0)
    with pytest.raises(ValueError, match="max_tokens_per_mb"):
        MicroBatchSpec(max_tokens_per_mb=0)
