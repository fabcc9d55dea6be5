"""DeepSpeed-Chat's phase formats (padded, for users of padded batches) and the packed ``dschat`` dataset."""

import pytest
import torch
from dschat_fixtures import write_local_copy

from realrl.api.core.data_api import DatasetUtility, SequenceSample
from realrl.impl.dataset.dschat import get_raw_dataset, phase_indices
from realrl.impl.dataset.dschat.dataset import DSChatDataset
from realrl.impl.dataset.dschat.phases import DataCollatorReward, DataCollatorRLHF, prepare_data
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.samples import pairs_of

EOT = "<|endoftext|>"


@pytest.fixture
def rm_static(tmp_path):
    return get_raw_dataset("Dahoas/rm-static", write_local_copy(str(tmp_path), "Dahoas/rm-static", n=6))


def test_phase1_padded_with_labels(rm_static, tokenizer):
    row = rm_static.get_train_data()[0]
    out = prepare_data(row, rm_static, 1, tokenizer, max_seq_len=32, eos_token=EOT)
    ids = tokenizer(rm_static.get_prompt_and_chosen(row) + EOT)["input_ids"]
    n = len(ids)
    assert out["input_ids"].shape == (32,) and out["input_ids"][:n].tolist() == ids
    assert (out["input_ids"][n:] == tokenizer.pad_token_id).all()
    assert out["attention_mask"].tolist() == [1] * n + [0] * (32 - n)
    assert out["labels"][:n].tolist() == ids and (out["labels"][n:] == -100).all()
    short = prepare_data(row, rm_static, 1, tokenizer, max_seq_len=4, eos_token=EOT)
    assert short["input_ids"].tolist() == ids[:4]  # DeepSpeed-Chat truncates in phases 1 and 2


def test_phase2_and_reward_collator(rm_static, tokenizer):
    rows = rm_static.get_train_data()[:3]
    outs = [prepare_data(r, rm_static, 2, tokenizer, max_seq_len=24, eos_token=EOT) for r in rows]
    c0 = tokenizer(rm_static.get_prompt_and_chosen(rows[0]) + EOT)["input_ids"]
    r0 = tokenizer(rm_static.get_prompt_and_rejected(rows[0]) + EOT)["input_ids"]
    assert outs[0]["chosen_input_ids"][: len(c0)].tolist() == c0
    assert outs[0]["rejected_input_ids"][: len(r0)].tolist() == r0
    assert outs[0]["rejected_attention_mask"].sum() == len(r0)
    batch = DataCollatorReward()(outs)
    assert batch["input_ids"].shape == (6, 24)
    assert torch.equal(batch["input_ids"][1], outs[1]["chosen_input_ids"])
    assert torch.equal(batch["input_ids"][4], outs[1]["rejected_input_ids"])


def test_phase3_flip_gives_left_padded_prompts(rm_static, tokenizer):
    rows = rm_static.get_train_data()[:3]
    outs = [prepare_data(r, rm_static, 3, tokenizer, max_seq_len=64, eos_token=EOT) for r in rows]
    prompts = [tokenizer(rm_static.get_prompt(r))["input_ids"] for r in rows]
    assert outs[0]["input_ids"].tolist() == prompts[0][::-1]
    pad = tokenizer.pad_token_id
    for width in (4, 40):
        batch = DataCollatorRLHF(max_token_len=width, pad_token_id=pad)(outs)
        L = max(width, max(map(len, prompts)))
        assert batch["prompt"].tolist() == [[pad] * (L - len(p)) + p for p in prompts]
        assert batch["prompt_att_mask"].tolist() == [[0] * (L - len(p)) + [1] * len(p) for p in prompts]
    assert prepare_data(rows[0], rm_static, 3, tokenizer, max_seq_len=2, eos_token=EOT) is None
    with pytest.raises(ValueError, match="train_phase"):
        prepare_data(rows[0], rm_static, 4, tokenizer, max_seq_len=2, eos_token=EOT)


def test_rows_without_rejected_give_none_in_phase2(tmp_path, tokenizer):
    raw = get_raw_dataset("wangrui6/Zhihu-KOL", write_local_copy(str(tmp_path), "wangrui6/Zhihu-KOL"))
    row = raw.get_train_data()[0]
    assert prepare_data(row, raw, 2, tokenizer, max_seq_len=16, eos_token=EOT) is None
    assert prepare_data(row, raw, 1, tokenizer, max_seq_len=16, eos_token=EOT) is not None


def _phase(util, sources, phase, **kw):
    return DSChatDataset(util, sources=sources, phase=phase, max_seq_len=256, **kw)


def test_one_corpus_three_disjoint_phases(tmp_path, util, tokenizer):
    path = write_local_copy(str(tmp_path), "Dahoas/rm-static", n=20)
    sources = {"Dahoas/rm-static": path}
    ds = {
        p: _phase(util, sources, p, data_split="2,4,4", cache_dir=str(tmp_path / "cache")) for p in (1, 2, 3)
    }
    ids = {p: {s.ids[0] for s in d.samples} for p, d in ds.items()}
    assert [len(ids[p]) for p in (1, 2, 3)] == [4, 8, 8]
    assert not (ids[1] & ids[2] or ids[1] & ids[3] or ids[2] & ids[3])
    assert set().union(*ids.values()) == {f"Dahoas/rm-static:train:{i}" for i in range(20)}
    assert sorted(int(i.rsplit(":", 1)[1]) for i in ids[2]) == sorted(
        phase_indices(20, "2,4,4", 2, util.seed)
    )
    raw = get_raw_dataset("Dahoas/rm-static", path)
    rows = raw.get_train_data()
    s1 = ds[1][0]
    i = int(s1.ids[0].rsplit(":", 1)[1])
    assert (
        s1.data["packed_input_ids"].tolist()
        == tokenizer(raw.get_prompt_and_chosen(rows[i]) + EOT)["input_ids"]
    )
    assert not s1.data["prompt_mask"].any()  # DeepSpeed-Chat's phase 1: loss on every token
    s2 = ds[2][0]
    i = int(s2.ids[0].rsplit(":", 1)[1])
    ((c, r),) = pairs_of(s2)
    assert c == tokenizer(raw.get_prompt_and_chosen(rows[i]) + EOT)["input_ids"]
    assert r == tokenizer(raw.get_prompt_and_rejected(rows[i]) + EOT)["input_ids"]
    s3 = ds[3][0]
    i = int(s3.ids[0].rsplit(":", 1)[1])
    assert s3.data["packed_prompts"].tolist() == tokenizer(raw.get_prompt(rows[i]))["input_ids"]
    for d in ds.values():
        SequenceSample.gather(d.samples)  # every phase batches


def test_prompt_mask_option_and_eval_part(tmp_path, util, tokenizer):
    sources = [
        {"name": "Dahoas/rm-static", "path": write_local_copy(str(tmp_path), "Dahoas/rm-static", n=10)}
    ]
    d = _phase(util, sources, 1, loss_on_prompt=False, part="eval", data_split="1")
    assert len(d) == 10 and all(s.ids[0].startswith("Dahoas/rm-static:eval:") for s in d.samples)
    raw = get_raw_dataset("Dahoas/rm-static", sources[0]["path"])
    s = d[0]
    row = raw.get_eval_data()[int(s.ids[0].rsplit(":", 1)[1])]
    n_prompt = len(tokenizer(raw.get_prompt(row))["input_ids"])
    assert s.data["prompt_mask"].tolist() == [True] * n_prompt + [False] * (
        s.data["prompt_mask"].numel() - n_prompt
    )


def test_blending_two_sources_by_weight(tmp_path, util):
    sources = {
        "Dahoas/rm-static": write_local_copy(str(tmp_path), "Dahoas/rm-static", n=10),
        "stanfordnlp/SHP": write_local_copy(str(tmp_path), "stanfordnlp/SHP", n=10),
    }
    d = _phase(util, sources, 2, data_split="0,1,0", weights=[3, 1], total=20)
    names = [s.ids[0].split(":")[0] for s in d.samples]
    assert names.count("Dahoas/rm-static") == 15 and names.count("stanfordnlp/SHP") == 5
    assert len({s.ids[0] for s in d.samples}) == 20  # repeats get their own ids ("#1")


def test_sources_without_rejected_are_reported_in_phase2(tmp_path, util, realrl_logs):
    sources = {
        "Dahoas/rm-static": write_local_copy(str(tmp_path), "Dahoas/rm-static", n=10),
        "lmqg/qg_jaquad": write_local_copy(str(tmp_path), "lmqg/qg_jaquad", n=10),
    }
    d = _phase(util, sources, 2, data_split="0,1,0")
    assert len(d) == 10 and d.dropped == {"no chosen or rejected text": 10}
    assert any("left out" in m for m in realrl_logs)
    with pytest.raises(DataError, match="every row"):
        _phase(util, {"lmqg/qg_jaquad": sources["lmqg/qg_jaquad"]}, 2, data_split="0,1,0")


def test_sharded_phases_cover_the_phase(tmp_path, tokenizer):
    sources = {"Dahoas/rm-static": write_local_copy(str(tmp_path), "Dahoas/rm-static", n=20)}
    single = {s.ids[0] for s in _phase(DatasetUtility(2, 0, 1, tokenizer), sources, 3).samples}
    shards = [
        {s.ids[0] for s in _phase(DatasetUtility(2, r, 3, tokenizer), sources, 3).samples} for r in range(3)
    ]
    assert set().union(*shards) == single and sum(map(len, shards)) == len(single)


def test_bad_row_in_a_source_names_file_and_line(tmp_path, util):
    path = write_local_copy(str(tmp_path), "Dahoas/rm-static", n=4)
    with open(f"{path}/train.jsonl", "a") as f:
        f.write('{"prompt": "p", "chosen": 5, "rejected": "r"}\n')
    with pytest.raises(
        DataError, match=r"train.jsonl: line 5: Dahoas/rm-static: field \['chosen'\] must be text"
    ):
        _phase(util, {"Dahoas/rm-static": path}, 2, data_split="0,1,0")
