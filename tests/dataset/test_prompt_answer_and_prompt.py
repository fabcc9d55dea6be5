"""``prompt_answer`` (SFT) and ``prompt`` (PPO/GRPO) datasets."""

import json

import pytest
import torch

from realrl.api.core.config import DatasetAbstraction
from realrl.api.core.data_api import DatasetUtility, SequenceSample, make_dataset
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.prompt import PromptDataset
from realrl.impl.dataset.prompt_answer import PromptAnswerDataset

ROWS = [
    {"prompt": "Human: what is the capital of France? Assistant:", "answer": " Paris is the capital."},
    {"prompt": "Tell me a story", "answer": " about a quiet cat."},
    {"prompt": "The answer is", "answer": " 42."},
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_prompt_answer_layout(util, tokenizer, tmp_path):
    ds = make_dataset(
        DatasetAbstraction("prompt_answer", {"dataset_path": _write_jsonl(tmp_path / "d.jsonl", ROWS)}),
        seed=1,
        dp_rank=0,
        world_size=1,
        tokenizer_or_tokenizer_name=tokenizer,
    )
    assert len(ds) == 3
    for i, row in enumerate(ROWS):
        s = ds[i]
        assert isinstance(s, SequenceSample) and s.bs == 1 and s.ids == [i]
        p = tokenizer(row["prompt"])["input_ids"]
        a = tokenizer(row["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert s.data["packed_input_ids"].tolist() == p + a
        assert s.data["prompt_mask"].tolist() == [True] * len(p) + [False] * len(a)
        assert s.seqlens["packed_input_ids"] == [[len(p) + len(a)]] == s.seqlens["prompt_mask"]
    batch = SequenceSample.gather([ds[i] for i in range(3)])
    assert batch.bs == 3


def test_loss_on_every_token_and_existing_eos(util, tokenizer):
    rows = [{"q": "Tell me", "a": " a story<|endoftext|>"}]
    ds = PromptAnswerDataset(util, dataset_path=rows, prompt_key="q", answer_key="a", loss_on_prompt=True)
    ids = ds[0].data["packed_input_ids"].tolist()
    assert ids.count(tokenizer.eos_token_id) == 1 and ids[-1] == tokenizer.eos_token_id
    assert not ds[0].data["prompt_mask"].any()


def test_prompt_answer_max_length_filters_or_truncates(util, tokenizer, realrl_logs):
    lens = [len(tokenizer(r["prompt"] + r["answer"])["input_ids"]) + 1 for r in ROWS]
    limit = sorted(lens)[1]
    ds = PromptAnswerDataset(util, dataset_path=ROWS, max_length=limit)
    assert len(ds) == sum(n <= limit for n in lens) and ds.n_filtered == 3 - len(ds)
    assert any("left out" in m and f"max_length={limit}" in m for m in realrl_logs)
    cut = PromptAnswerDataset(util, dataset_path=ROWS, max_length=limit, truncate=True)
    prompt_lens = [len(tokenizer(r["prompt"])["input_ids"]) for r in ROWS]
    assert [s.ids[0] for s in cut.samples] == [i for i, n in enumerate(prompt_lens) if n < limit]
    for s in cut.samples:
        i = s.ids[0]
        assert s.data["packed_input_ids"].numel() == min(lens[i], limit)
        assert int(s.data["prompt_mask"].sum()) == prompt_lens[i]


def test_prompt_answer_chat_rows(util, tokenizer):
    rows = [
        {"prompt": [{"role": "user", "content": "hi"}], "answer": [{"role": "assistant", "content": "hello"}]}
    ]
    s = PromptAnswerDataset(util, dataset_path=rows)[0]
    full = tokenizer.apply_chat_template(
        rows[0]["prompt"] + rows[0]["answer"], tokenize=True, return_dict=True
    )
    prompt = tokenizer.apply_chat_template(
        rows[0]["prompt"], tokenize=True, return_dict=True, add_generation_prompt=True
    )
    assert s.data["packed_input_ids"].tolist() == list(full["input_ids"])
    assert int(s.data["prompt_mask"].sum()) == len(prompt["input_ids"])


def test_prompt_answer_bad_rows_name_the_row_and_field(util, tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [ROWS[0], {"prompt": "x"}])
    with pytest.raises(DataError, match=rf"{path}: line 2: missing field 'answer'"):
        PromptAnswerDataset(util, dataset_path=path)
    path = _write_jsonl(tmp_path / "e.jsonl", [ROWS[0], ROWS[1], {"prompt": 3, "answer": "y"}])
    with pytest.raises(
        DataError, match=rf"{path}: line 3: field 'prompt' must be a string or a list, got int"
    ):
        PromptAnswerDataset(util, dataset_path=path)
    with pytest.raises(ValueError, match="exactly one of dataset_path and dataset_builder"):
        PromptAnswerDataset(util)


def test_prompt_dataset_filters_long_prompts_and_reports(util, tokenizer, realrl_logs):
    rows = [{"prompt": "a " * n, "answer_ref": str(n)} for n in (2, 30, 3, 40)]
    ds = PromptDataset(util, dataset_builder=lambda: rows, max_prompt_len=10, metadata_keys=["answer_ref"])
    assert [s.ids[0] for s in ds.samples] == [0, 2]  # ids are row indices, stable after filtering
    assert ds.n_filtered == 2 and ds.dropped == {"prompt longer than max_prompt_len=10": 2}
    assert any(m.startswith("WARNING") and "kept 2 of 4" in m for m in realrl_logs)
    s = ds[1]
    assert s.keys == {"packed_prompts"} and s.metadata == {"answer_ref": ["3"]}
    assert s.data["packed_prompts"].tolist() == tokenizer(rows[2]["prompt"])["input_ids"]
    assert s.data["packed_prompts"].dtype == torch.long


def test_prompt_dataset_pretokenized_chat_and_all_filtered(util, tokenizer):
    msgs = [{"role": "user", "content": "hi"}]
    ds = PromptDataset(util, dataset_path=[{"prompt": [5, 6, 7]}, {"prompt": msgs}], id_key=None)
    assert ds[0].data["packed_prompts"].tolist() == [5, 6, 7]
    want = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True)
    assert ds[1].data["packed_prompts"].tolist() == list(want["input_ids"])
    with pytest.raises(DataError, match="every row of rank 0 was left out"):
        PromptDataset(util, dataset_path=[{"prompt": "a " * 50}], max_prompt_len=3)
    with pytest.raises(DataError, match=r"field 'prompt'\[1\] must be a non-negative integer"):
        PromptDataset(util, dataset_path=[{"prompt": [1, -2]}])


def test_id_key_must_be_unique(util):
    ds = PromptDataset(
        util, dataset_path=[{"prompt": "a", "uid": "x"}, {"prompt": "b", "uid": "y"}], id_key="uid"
    )
    assert [s.ids[0] for s in ds.samples] == ["x", "y"]
    with pytest.raises(DataError, match="repeats id 'x'"):
        PromptDataset(
            util, dataset_path=[{"prompt": "a", "uid": "x"}, {"prompt": "b", "uid": "x"}], id_key="uid"
        )


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharding_covers_every_row_once(tokenizer, world_size):
    rows = [{"prompt": f"row {i}"} for i in range(10)]
    seen = []
    for rank in range(world_size):
        u = DatasetUtility(seed=7, dp_rank=rank, world_size=world_size, tokenizer=tokenizer)
        ds = PromptDataset(u, dataset_path=rows)
        seen += [s.ids[0] for s in ds.samples]
        for s in ds.samples:  # the id is the row it came from, whatever the sharding
            assert s.data["packed_prompts"].tolist() == tokenizer(f"row {s.ids[0]}")["input_ids"]
    assert sorted(seen) == list(range(10))
