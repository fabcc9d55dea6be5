"""``rw_paired``: TRL's row formats (RewardTrainer), [c1, r1, c2, r2, ...] packing, margins, filtering."""

import pytest
import torch

from realrl.api.core.data_api import SequenceSample
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.rw_paired import RewardPairDataset
from realrl.impl.dataset.samples import pairs_of

EOS = "<|endoftext|>"


def _ids(tokenizer, text):
    return tokenizer(text)["input_ids"]


def test_text_rows_get_eos_and_prompt(util, tokenizer):
    rows = [
        {"chosen": "The answer is 42.", "rejected": "I don't know."},
        {"prompt": "What is the answer? ", "chosen": "42." + EOS, "rejected": "No idea."},
    ]
    ds = RewardPairDataset(util, dataset_path=rows)
    ((c, r),) = pairs_of(ds[0])
    assert c == _ids(tokenizer, "The answer is 42." + EOS) and r == _ids(tokenizer, "I don't know." + EOS)
    ((c, r),) = pairs_of(ds[1])
    assert c == _ids(tokenizer, "What is the answer? 42." + EOS)  # EOS already there: not doubled
    assert r == _ids(tokenizer, "What is the answer? No idea." + EOS)
    assert ds[1].seqlens["packed_input_ids"] == [[len(c), len(r)]]
    assert "margins" not in ds[0].keys


def test_pretokenized_rows_skip_tokenization_both_spellings(util):
    rows = [
        {"chosen_ids": [1, 2, 3], "rejected_ids": [4, 5]},
        {"chosen_input_ids": [6, 7], "rejected_input_ids": [8]},
        # the new spelling wins when both are present, as TRL keeps chosen_ids
        {"chosen_ids": [9], "rejected_ids": [10], "chosen_input_ids": [0], "rejected_input_ids": [0]},
    ]
    ds = RewardPairDataset(util, dataset_path=rows)
    assert [pairs_of(s) for s in ds.samples] == [[([1, 2, 3], [4, 5])], [([6, 7], [8])], [([9], [10])]]
    assert ds[0].data["packed_input_ids"].tolist() == [1, 2, 3, 4, 5]


def test_max_length_filters_never_truncates(util, realrl_logs):
    rows = [
        {"chosen_ids": [1] * 4, "rejected_ids": [2] * 2},
        {"chosen_ids": [1] * 2, "rejected_ids": [2] * 5},  # rejected too long
        {"chosen_ids": [1] * 5, "rejected_ids": [2] * 1},  # chosen too long
    ]
    ds = RewardPairDataset(util, dataset_path=rows, max_length=4)
    assert [s.ids[0] for s in ds.samples] == [0]
    assert pairs_of(ds[0]) == [([1] * 4, [2] * 2)]
    assert ds.dropped["pairs longer than max_length=4"] == 2
    assert any(m.startswith("WARNING") and "kept 1 of 3" in m for m in realrl_logs)


def test_several_pairs_per_prompt_and_margins(util, tokenizer):
    rows = [
        {
            "prompt": "Q: ",
            "pos": ["a", "b", "c"],
            "neg": ["x", "y", "z"],
            "margin": [0.5, 1.0, 2.0],
        }
    ]
    full = RewardPairDataset(
        util, dataset_path=rows, chosen_key="pos", rejected_key="neg", max_pairs_per_prompt=None
    )
    s = full[0]
    assert s.seqlens["packed_input_ids"][0] == [len(_ids(tokenizer, "Q: " + t + EOS)) for t in "axbycz"]
    assert pairs_of(s)[1] == (_ids(tokenizer, "Q: b" + EOS), _ids(tokenizer, "Q: y" + EOS))
    assert s.data["margins"].tolist() == [0.5, 0.5, 1.0, 1.0, 2.0, 2.0]
    assert s.seqlens["margins"] == [[1] * 6]
    two = RewardPairDataset(
        util, dataset_path=rows, chosen_key="pos", rejected_key="neg", max_pairs_per_prompt=2
    )
    again = RewardPairDataset(
        util, dataset_path=rows, chosen_key="pos", rejected_key="neg", max_pairs_per_prompt=2
    )
    assert two[0] == again[0]  # the kept subset is a function of (seed, id)
    kept = pairs_of(two[0])
    assert len(kept) == 2 and all(p in pairs_of(s) for p in kept)
    m = two[0].data["margins"].tolist()
    assert m[0] == m[1] and m[2] == m[3] and {m[0], m[2]} < {0.5, 1.0, 2.0}


def test_conversational_rows_use_the_chat_template(util, tokenizer):
    prompt = [{"role": "user", "content": "What color is the sky?"}]
    chosen = [{"role": "assistant", "content": "Blue."}]
    rejected = [{"role": "assistant", "content": "Green."}]
    ds = RewardPairDataset(util, dataset_path=[{"prompt": prompt, "chosen": chosen, "rejected": rejected}])
    ((c, r),) = pairs_of(ds[0])
    want = tokenizer.apply_chat_template(prompt + chosen, tokenize=True, return_dict=True)["input_ids"]
    assert c == list(want) and tokenizer.eos_token_id not in c  # no EOS text for chat rows
    assert r == list(
        tokenizer.apply_chat_template(prompt + rejected, tokenize=True, return_dict=True)["input_ids"]
    )


def test_gathered_batch_keeps_pair_structure(util):
    rows = [
        {"chosen_ids": [1] * (i + 1), "rejected_ids": [2] * (i + 2), "margin": float(i)} for i in range(3)
    ]
    ds = RewardPairDataset(util, dataset_path=rows)
    batch = SequenceSample.gather(ds.samples)
    assert batch.seqlens["packed_input_ids"] == [[1, 2], [2, 3], [3, 4]]
    assert batch.data["margins"].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert batch.data["margins"].dtype == torch.float32


@pytest.mark.parametrize(
    "row,match",
    [
        ({"chosen": "a"}, "missing field 'rejected'"),
        ({"chosen": 1, "rejected": "b"}, "field 'chosen' must be a string or a list, got int"),
        ({"chosen": ["a", "b"], "rejected": ["c"]}, "hold 2 and 1 answers"),
        ({"chosen_ids": [1, "x"], "rejected_ids": [2]}, r"field 'chosen_ids'\[1\]"),
        ({"prompt": 5, "chosen": "a", "rejected": "b"}, "field 'prompt' must be text"),
        ({"chosen": "a", "rejected": "b", "margin": "big"}, "field 'margin' must be a number or a list"),
    ],
)
def test_bad_rows_name_file_line_and_field(util, tmp_path, row, match):
    import json

    p = tmp_path / "d.jsonl"
    first = {"chosen": "ok", "rejected": "no", **({"margin": 0.0} if "margin" in row else {})}
    p.write_text(json.dumps(first) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"{p}: line 2: .*{match}"):
        RewardPairDataset(util, dataset_path=str(p))


def test_margin_on_some_rows_only_is_an_error(util):
    rows = [{"chosen_ids": [1], "rejected_ids": [2], "margin": 1.0}, {"chosen_ids": [1], "rejected_ids": [2]}]
    with pytest.raises(DataError, match="row 1: missing field 'margin'"):
        RewardPairDataset(util, dataset_path=rows)
    with pytest.raises(DataError, match="row 1: field 'margin' is set"):
        RewardPairDataset(util, dataset_path=rows[::-1])


def test_margin_key_none_ignores_margins(util):
    rows = [{"chosen_ids": [1], "rejected_ids": [2], "margin": 1.0}]
    assert "margins" in RewardPairDataset(util, dataset_path=rows)[0].keys
    assert "margins" not in RewardPairDataset(util, dataset_path=rows, margin_key=None)[0].keys
