import filecmp
import json

import pytest

from realrl.impl.dataset.toy import ToyTaskConfig, ToyVocab, build_toy_task, true_reward
from realrl.impl.dataset.toy.corpus import toy_model_config, toy_paths


def small(seed=1):
    return ToyTaskConfig(seed=seed, n_prompts=600)


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_true_reward():
    assert true_reward(" good bad great .") == 1.0
    assert true_reward(" good great kind") == 3.0 - 2.0
    assert true_reward("") == -2.0
    assert true_reward(" awful .") == -1.0


def test_vocab_is_disjoint_and_sized():
    v = ToyVocab()
    assert len(v.positive) == len(v.negative) == 20 and len(v.neutral) == 160
    assert len(set(v.tokens)) == len(v.tokens) == 206


def test_build_is_deterministic_for_a_seed_and_differs_across_seeds(tmp_path):
    a = build_toy_task(str(tmp_path / "a"), small(1))
    b = build_toy_task(str(tmp_path / "b"), small(1))
    build_toy_task(str(tmp_path / "c"), small(2))
    pa, pb, pc = (
        toy_paths(str(tmp_path / "a")),
        toy_paths(str(tmp_path / "b")),
        toy_paths(str(tmp_path / "c")),
    )
    for key in ("sft_train", "rm_train", "ppo_train", "ppo_valid"):
        assert filecmp.cmp(pa[key], pb[key], shallow=False)
        assert not filecmp.cmp(pa[key], pc[key], shallow=False)
    assert a["counts"] == b["counts"]
    assert filecmp.cmp(
        pa["tokenizer"] + "/tokenizer.json", pb["tokenizer"] + "/tokenizer.json", shallow=False
    )


def test_phases_are_disjoint_and_follow_the_split(tmp_path):
    m = build_toy_task(str(tmp_path / "t"), small())
    p = toy_paths(str(tmp_path / "t"))
    counts = m["counts"]
    sft = counts["sft_train"] + counts["sft_valid"]
    ppo = counts["ppo_train"] + counts["ppo_valid"]
    assert abs(sft - 120) <= 1 and abs(ppo - 240) <= 1  # "2,4,4" of 600 prompts
    rm_prompts = counts["rm_train"] + counts["rm_valid"] + m["rm_ties_dropped"]
    assert abs(rm_prompts - 240) <= 1
    sft_prompts = {r["prompt"] for k in ("sft_train", "sft_valid") for r in read(p[k])}
    ppo_prompts = {r["prompt"] for k in ("ppo_train", "ppo_valid") for r in read(p[k])}
    train, valid = {r["prompt"] for r in read(p["ppo_train"])}, {r["prompt"] for r in read(p["ppo_valid"])}
    # distinct prompt rows may repeat text by chance, but a whole phase overlapping would not
    assert len(sft_prompts & ppo_prompts) < 0.05 * len(sft_prompts)
    assert len(train & valid) < 0.05 * len(valid)


def test_preference_labels_follow_the_hidden_reward(tmp_path):
    build_toy_task(str(tmp_path / "t"), small())
    rows = read(toy_paths(str(tmp_path / "t"))["rm_train"])
    assert rows and all(true_reward(r["chosen"]) > true_reward(r["rejected"]) for r in rows)
    # some continuations lack the final period, so the RM sees the penalty (otherwise it is a blind
    # spot of the RM)
    assert any(not r["rejected"].endswith(" .") for r in rows)
    sft = read(toy_paths(str(tmp_path / "t"))["sft_train"])
    assert all(r["prompt"].endswith(" |") and r["answer"].endswith(" .") for r in sft)
    assert all(len(r["answer"].split()) == 12 for r in sft)


def test_rebuild_reuses_and_config_change_rebuilds(tmp_path):
    out = str(tmp_path / "t")
    m1 = build_toy_task(out, small())
    stamp = (tmp_path / "t" / "manifest.json").stat().st_mtime_ns
    assert build_toy_task(out, small()) == m1
    assert (tmp_path / "t" / "manifest.json").stat().st_mtime_ns == stamp
    m2 = build_toy_task(out, ToyTaskConfig(seed=1, n_prompts=500))
    assert m2["fingerprint"] != m1["fingerprint"]


def test_tokenizer_round_trip(tmp_path):
    from transformers import AutoTokenizer

    build_toy_task(str(tmp_path / "t"), small())
    tok = AutoTokenizer.from_pretrained(toy_paths(str(tmp_path / "t"))["tokenizer"])
    text = "good bado | kind great ."
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and tok.unk_token_id not in ids
    cfg = toy_model_config()
    assert cfg["vocab_size"] == len(tok) and cfg["eos_token_id"] == tok.eos_token_id


@pytest.mark.parametrize("field", ["n_prompts", "seed"])
def test_fingerprint_changes_with_config(field):
    a = small()
    b = small()
    setattr(b, field, getattr(b, field) + 1)
    assert a.fingerprint() != b.fingerprint()
