"""Parity with TRL 1.16's reward-model data pipeline: the same examples through TRL and through
realrl give the same tensors (collator) and the same token ids and kept rows (dataset
preparation)."""

import tempfile
import warnings

import pytest
import torch
from dataset_tokenizer import EOS, build_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from realrl.api.core.data_api import DatasetUtility, load_hf_tokenizer
from realrl.impl.dataset.collators import DataCollatorForPreference, preference_examples
from realrl.impl.dataset.rw_paired import RewardPairDataset
from realrl.impl.dataset.samples import pairs_of

reward_trainer = pytest.importorskip("trl.trainer.reward_trainer")
datasets = pytest.importorskip("datasets")

seqs = st.lists(st.integers(0, 500), min_size=1, max_size=12)
examples = st.lists(
    st.tuples(seqs, seqs, st.floats(-3, 3, allow_nan=False, width=32)), min_size=1, max_size=6
)


def _same(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for k in theirs:
        assert ours[k].dtype == theirs[k].dtype, k
        assert torch.equal(ours[k], theirs[k]), k


@settings(max_examples=60, deadline=None)
@given(
    ex=examples,
    pad=st.integers(0, 9),
    multiple=st.one_of(st.none(), st.integers(1, 8)),
    with_margin=st.booleans(),
    legacy=st.booleans(),
)
def test_collator_matches_trl(ex, pad, multiple, with_margin, legacy):
    trl_examples = [
        {"chosen_ids": c, "rejected_ids": r, **({"margin": m} if with_margin else {})} for c, r, m in ex
    ]
    c_key, r_key = ("chosen_input_ids", "rejected_input_ids") if legacy else ("chosen_ids", "rejected_ids")
    our_examples = [
        {c_key: e["chosen_ids"], r_key: e["rejected_ids"], **({"margin": e["margin"]} if with_margin else {})}
        for e in trl_examples
    ]
    theirs = reward_trainer.DataCollatorForPreference(pad_token_id=pad, pad_to_multiple_of=multiple)(
        trl_examples
    )
    ours = DataCollatorForPreference(pad_token_id=pad, pad_to_multiple_of=multiple)(our_examples)
    _same(ours, theirs)
    n = len(ex)
    assert ours["input_ids"].shape[0] == 2 * n
    assert ours["input_ids"].shape[1] % (multiple or 1) == 0


def test_collator_reads_rw_paired_samples(util):
    rows = [
        {"chosen_ids": [1, 2, 3], "rejected_ids": [4, 5], "margin": 0.5},
        {"chosen_ids": [6, 7], "rejected_ids": [8], "margin": 0.0},
    ]
    ds = RewardPairDataset(util, dataset_path=rows)
    ex = preference_examples(ds.samples)
    theirs = reward_trainer.DataCollatorForPreference(pad_token_id=0)(rows)
    _same(DataCollatorForPreference(pad_token_id=0)(ex), theirs)
    assert theirs["input_ids"].tolist() == [[1, 2, 3], [6, 7, 0], [4, 5, 0], [8, 0, 0]]


@pytest.fixture(scope="module")
def bos_tokenizer():
    return load_hf_tokenizer(build_tokenizer(tempfile.mkdtemp(), with_pad=True, with_bos=True))


def _trl_prepare(tokenizer, rows, max_length):
    from trl import RewardConfig

    args = RewardConfig(
        output_dir=tempfile.mkdtemp(), max_length=max_length, report_to=[], use_cpu=True, bf16=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = reward_trainer.RewardTrainer._prepare_dataset(
            None, datasets.Dataset.from_list(rows), tokenizer, args, "train"
        )
    return [(r["chosen_ids"], r["rejected_ids"]) for r in out.to_list()]


MSG = [{"role": "user", "content": "What color is the sky?"}]
CASES = {
    "implicit_prompt": [
        {"chosen": "The answer is 42.", "rejected": "I don't know."},
        {"chosen": "Paris is the capital." + EOS, "rejected": "London is the capital."},
        {"chosen": "Tell me a story about a quiet cat and a loud dog.", "rejected": "no"},
    ],
    "explicit_prompt": [
        {"prompt": "What is the answer? ", "chosen": "42.", "rejected": "I don't know."},
        {
            "prompt": "What is the capital of France? ",
            "chosen": "Paris.",
            "rejected": "London is the capital of England.",
        },
    ],
    "conversational": [
        {
            "prompt": MSG,
            "chosen": [{"role": "assistant", "content": "Blue."}],
            "rejected": [{"role": "assistant", "content": "Green, like a quiet cat and a loud dog."}],
        },
        {
            "prompt": MSG,
            "chosen": [{"role": "assistant", "content": "It is blue."}],
            "rejected": [{"role": "assistant", "content": "Red."}],
        },
    ],
    "pretokenized": [
        {"chosen_ids": [1, 2, 3], "rejected_ids": [4, 5]},
        {"chosen_ids": list(range(30)), "rejected_ids": [8]},
    ],
    "pretokenized_legacy": [
        {"chosen_input_ids": [1, 2, 3], "rejected_input_ids": [4, 5]},
        {"chosen_input_ids": [6], "rejected_input_ids": list(range(30))},
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("filtered", [False, True])
def test_prepared_pairs_match_trl(bos_tokenizer, case, filtered):
    rows = CASES[case]
    max_length = None
    if filtered:  # the shortest row's longer side: keeps that row, drops the longer ones
        max_length = min(max(len(c), len(r)) for c, r in _trl_prepare(bos_tokenizer, rows, None))
    theirs = _trl_prepare(bos_tokenizer, rows, max_length)
    util = DatasetUtility(seed=0, dp_rank=0, world_size=1, tokenizer=bos_tokenizer)
    ds = RewardPairDataset(util, dataset_path=rows, max_length=max_length)
    ours = [pairs_of(s)[0] for s in ds.samples]
    assert ours == theirs and ours
    if filtered:
        assert len(ours) < len(rows)  # the filter really removed something here
