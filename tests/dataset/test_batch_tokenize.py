"""Batched tokenization ahead of each chunk of rows: the same ids and errors as row-by-row."""

import gc
import json
import random

import pytest
from dataset_tokenizer import build_tokenizer

from realrl.api.core.data_api import DatasetUtility, load_hf_tokenizer
from realrl.impl.dataset import base
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.prompt import PromptDataset
from realrl.impl.dataset.prompt_answer import PromptAnswerDataset
from realrl.impl.dataset.rw_paired import RewardPairDataset
from realrl.impl.dataset.samples import pairs_of
from realrl.impl.dataset.tokenize import BatchTokenizer

WORDS = ["Paris", "capital", "cat", " dog", "42", "story", "東京", "?", " ", "Human:", "<|endoftext|>"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """Adds BOS with add_special_tokens=True, so the two ways of calling it differ."""
    tok = load_hf_tokenizer(
        build_tokenizer(str(tmp_path_factory.mktemp("tok_bos")), with_pad=True, with_bos=True)
    )
    assert tok("cat")["input_ids"] == [tok.bos_token_id] + tok("cat", add_special_tokens=False)["input_ids"]
    return tok


@pytest.fixture
def util(tokenizer):
    return DatasetUtility(seed=1, dp_rank=0, world_size=1, tokenizer=tokenizer)


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(["", " "]) for _ in range(rng.randint(1, 8)))


def test_batch_tokenizer_matches_single_calls_and_hands_out_fresh_lists(tokenizer):
    rng = random.Random(0)
    texts = [_text(rng) for _ in range(40)]
    tok = BatchTokenizer(tokenizer)
    tok.prefetch([(t, True) for t in texts[:20]] + [(t, False) for t in texts[:20]])
    for special in (True, False):
        for t in texts:  # the first 20 read ahead, the last 20 tokenized alone
            assert tok(t, add_special_tokens=special) == tokenizer(t, add_special_tokens=special)["input_ids"]
    got = tok(texts[0])
    got.append(-1)  # a caller appending EOS must not change what the next row gets
    assert tok(texts[0]) == tokenizer(texts[0])["input_ids"]
    tok.prefetch([])
    assert tok._ids == {}  # the previous chunk is forgotten: memory stays bounded


def test_many_chunks_give_row_by_row_ids(util, tokenizer, monkeypatch):
    monkeypatch.setattr(base, "BATCH_ROWS", 7)  # 50 rows -> 8 chunks, and a repeated text across chunks
    rng = random.Random(1)
    rows = [{"prompt": _text(rng), "answer": _text(rng)} for _ in range(49)] + [
        {"prompt": "cat", "answer": "cat"}
    ]
    ds = PromptAnswerDataset(util, dataset_path=rows)
    eos = tokenizer.eos_token_id
    for s in ds.samples:
        row = rows[s.ids[0]]
        p = tokenizer(row["prompt"])["input_ids"]
        a = tokenizer(row["answer"], add_special_tokens=False)["input_ids"]
        a = a if a and a[-1] == eos else a + [eos]
        assert s.data["packed_input_ids"].tolist() == p + a
        assert s.data["prompt_mask"].tolist() == [True] * len(p) + [False] * len(a)
    prompts = PromptDataset(util, dataset_path=[{"prompt": r["prompt"]} for r in rows])
    for s in prompts.samples:
        assert s.data["packed_prompts"].tolist() == tokenizer(rows[s.ids[0]]["prompt"])["input_ids"]
    pairs = RewardPairDataset(
        util, dataset_path=[{"prompt": r["prompt"], "chosen": r["answer"], "rejected": "x"} for r in rows]
    )
    for s in pairs.samples:
        row = rows[s.ids[0]]
        c = (
            row["answer"]
            if row["answer"].endswith(tokenizer.eos_token)
            else row["answer"] + tokenizer.eos_token
        )
        ((chosen, rejected),) = pairs_of(s)
        assert chosen == tokenizer(row["prompt"] + c)["input_ids"]
        assert rejected == tokenizer(row["prompt"] + "x" + tokenizer.eos_token)["input_ids"]


def test_bad_row_in_a_later_chunk_names_its_line_and_mixed_rows_still_build(
    util, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setattr(base, "BATCH_ROWS", 4)
    rows = [{"chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(9)]
    rows[2] = {"chosen_ids": [5, 6], "rejected_ids": [7]}  # pre-tokenized: nothing to read ahead
    rows[3] = {"chosen": ["a", "b"], "rejected": ["c", "d"]}  # two pairs in one row
    rows[6] = {"chosen": 3, "rejected": "x"}  # the hint cannot read it; the builder must name it
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        DataError, match=r"p\.jsonl: line 7: field 'chosen' must be a string or a list, got int 3"
    ):
        RewardPairDataset(util, dataset_path=str(path), margin_key=None)
    del rows[6]
    ds = RewardPairDataset(util, dataset_path=rows, max_pairs_per_prompt=None)
    assert pairs_of(ds[2]) == [([5, 6], [7])]
    eos = tokenizer.eos_token
    assert pairs_of(ds[3]) == [
        (tokenizer("a" + eos)["input_ids"], tokenizer("c" + eos)["input_ids"]),
        (tokenizer("b" + eos)["input_ids"], tokenizer("d" + eos)["input_ids"]),
    ]


@pytest.mark.parametrize("enabled", [True, False])
def test_cyclic_gc_is_restored_after_a_build_even_a_failing_one(util, enabled):
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        PromptDataset(util, dataset_path=[{"prompt": "cat"}])
        assert gc.isenabled() == enabled
        with pytest.raises(DataError):
            PromptDataset(util, dataset_path=[{"prompt": 3}])
        assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()


def test_pretokenized_rows_need_no_tokenizer():
    """Reading ahead must not touch a tokenizer that pre-tokenized rows never needed."""
    no_tok = DatasetUtility(seed=1, dp_rank=0, world_size=1, tokenizer=None)
    pairs = RewardPairDataset(no_tok, dataset_path=[{"chosen_ids": [1, 2], "rejected_ids": [3]}])
    assert pairs_of(pairs[0]) == [([1, 2], [3])]
    prompts = PromptDataset(no_tok, dataset_path=[{"prompt": [4, 5]}])
    assert prompts[0].data["packed_prompts"].tolist() == [4, 5]
