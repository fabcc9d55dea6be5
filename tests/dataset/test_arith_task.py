"""The arithmetic task: deterministic files, disjoint splits, true answers, a round-tripping
tokenizer, and a noisy teacher that ``math_answer`` tells apart from the truth."""

import filecmp
import json
import os
import re

import pytest

from realrl.api.core.config import DatasetAbstraction
from realrl.api.core.data_api import load_hf_tokenizer, make_dataset
from realrl.impl.dataset.toy.arith import (
    TOKENS,
    ArithTaskConfig,
    arith_model_config,
    arith_paths,
    build_arith_task,
    completion_text,
    exact_match,
    needs_carry,
    solve,
    teacher_mistake,
)
from realrl.impl.rewards.math_answer import math_answer_reward

SMALL = {"n_train": 1500, "n_valid": 200, "n_sft_train": 1500}
PROMPT = re.compile(r"(\d+)([+\-*])(\d+)=\?")
FILES = ("sft_train", "sft_valid", "rl_train", "rl_valid")


def rows(paths, name):
    with open(paths[name]) as f:
        return [json.loads(line) for line in f]


def problem(prompt):
    m = PROMPT.fullmatch(prompt)
    assert m, prompt
    return int(m.group(1)), m.group(2), int(m.group(3))


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return build_arith_task(str(tmp_path_factory.mktemp("arith") / "seed3"), ArithTaskConfig(seed=3, **SMALL))


@pytest.fixture(scope="module")
def tok(task):
    return load_hf_tokenizer(task["tokenizer"])


def test_paths_and_manifest(task):
    assert task == arith_paths(os.path.dirname(task["manifest"]))
    with open(task["manifest"]) as f:
        manifest = json.load(f)
    assert manifest["counts"] == {"sft_train": 1500, "sft_valid": 200, "rl_train": 1500, "rl_valid": 200}
    assert manifest["max_new_tokens"] == 5  # "####", three digits, EOS
    assert manifest["valid_carry_fraction"] == pytest.approx(0.7)


def test_same_seed_same_files_other_seed_other_files(task, tmp_path):
    again = build_arith_task(str(tmp_path / "again"), ArithTaskConfig(seed=3, **SMALL))
    other = build_arith_task(str(tmp_path / "other"), ArithTaskConfig(seed=4, **SMALL))
    for name in FILES:
        assert filecmp.cmp(task[name], again[name], shallow=False), name
        assert not filecmp.cmp(task[name], other[name], shallow=False), name
    tok_json = [os.path.join(p["tokenizer"], "tokenizer.json") for p in (task, again)]
    assert filecmp.cmp(*tok_json, shallow=False)


def test_rebuilt_only_when_the_config_changes(tmp_path):
    out = str(tmp_path / "t")
    paths = build_arith_task(out, ArithTaskConfig(seed=5, **SMALL))
    with open(paths["rl_train"], "a") as f:
        f.write("marker\n")  # a rebuild would drop this line
    build_arith_task(out, ArithTaskConfig(seed=5, **SMALL))
    assert open(paths["rl_train"]).read().endswith("marker\n")
    build_arith_task(out, ArithTaskConfig(seed=5, teacher_error_rate=0.5, **SMALL))
    assert not open(paths["rl_train"]).read().endswith("marker\n")
    assert not os.path.exists(out + ".building")


def test_valid_problems_never_in_training(task):
    valid = {r["prompt"] for r in rows(task, "rl_valid")}
    assert valid == {r["prompt"] for r in rows(task, "sft_valid")}
    assert len(valid) == 200  # distinct
    train = {r["prompt"] for r in rows(task, "rl_train")} | {r["prompt"] for r in rows(task, "sft_train")}
    assert not valid & train
    assert len(train) > 1000


def test_rl_answers_are_true(task):
    for name in ("rl_train", "rl_valid"):
        for row in rows(task, name):
            assert set(row) == {"prompt", "answer"}
            a, op, b = problem(row["prompt"])
            assert row["answer"] == str(solve(a, op, b)) and op in "+-"
            assert 0 <= int(row["answer"]) <= 198 and len(row["answer"]) <= 3


def test_teacher_is_noisy_in_the_configured_way(task):
    train = rows(task, "sft_train")
    right = wrong = 0
    for row in train:
        assert set(row) == {"prompt", "answer"} and row["answer"].startswith("####")
        a, op, b = problem(row["prompt"])
        value = int(row["answer"][4:])
        assert value in (solve(a, op, b), teacher_mistake(a, op, b))
        if needs_carry(a, op, b):
            right += value == solve(a, op, b)
            wrong += value != solve(a, op, b)
    # carry problems are ~70 % of rows; the teacher forgets the carry on ~70 % of them
    assert 0.6 < (right + wrong) / len(train) < 0.8
    assert 0.6 < wrong / (right + wrong) < 0.8


@pytest.mark.parametrize(
    "a, op, b, truth, mistake",
    [(15, "+", 17, 32, 22), (95, "+", 17, 112, 102), (51, "+", 71, 122, 122), (12, "+", 7, 19, 19)]
    + [(52, "-", 17, 35, 45), (51, "-", 3, 48, 52), (87, "-", 2, 85, 85), (3, "*", 4, 12, 15)],
)
def test_teacher_mistake(a, op, b, truth, mistake):
    assert solve(a, op, b) == truth and teacher_mistake(a, op, b) == mistake
    assert needs_carry(a, op, b) == (truth != mistake)


def test_tokenizer_round_trips_one_token_per_symbol(task, tok):
    assert tok.eos_token_id == arith_model_config()["eos_token_id"]
    assert tok.pad_token_id == arith_model_config()["pad_token_id"]
    assert len(tok) == arith_model_config()["vocab_size"] == len(TOKENS)
    for row in rows(task, "sft_train")[:300] + rows(task, "rl_valid"):
        for text in (row["prompt"], row["answer"]):
            ids = tok(text, add_special_tokens=True)["input_ids"]
            assert tok.unk_token_id not in ids
            assert len(ids) == len(text) - (3 if text.startswith("####") else 0)  # "####" is one token
            assert tok.decode(ids) == text
    spaced = tok("47 + 38 = ?")["input_ids"]
    assert spaced == tok("47+38=?")["input_ids"]
    assert tok.convert_ids_to_tokens(tok("####107")["input_ids"]) == ["####", "1", "0", "7"]


def test_math_answer_scores_the_task_completions(task, tok):
    """Teacher completions, tokenized with EOS and decoded as the reward plugin decodes them:
    1.0 when the teacher was right, 0.0 when it forgot to carry."""
    sft = rows(task, "sft_train")[:400]
    completions, answers, expected = [], [], []
    for row in sft:
        a, op, b = problem(row["prompt"])
        ids = tok(row["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        completions.append(tok.decode(ids, skip_special_tokens=True))
        answers.append(str(solve(a, op, b)))
        expected.append(1.0 if int(row["answer"][4:]) == solve(a, op, b) else 0.0)
    assert 0.0 in expected and 1.0 in expected
    assert math_answer_reward([""] * len(sft), completions, answer=answers) == expected
    assert exact_match(completions, answers) == pytest.approx(sum(expected) / len(expected))
    refs = [r["answer"] for r in rows(task, "rl_valid")]
    assert exact_match([completion_text(int(r)) for r in refs], refs) == 1.0
    assert exact_match([completion_text(int(r) + 1) for r in refs], refs) == 0.0
    with pytest.raises(ValueError, match="2 completions for 1 answers"):
        exact_match(["####1", "####2"], ["1"])


def test_files_load_through_the_datasets(task, tok):
    sft = make_dataset(
        DatasetAbstraction("prompt_answer", {"dataset_path": task["sft_train"]}),
        seed=1,
        dp_rank=0,
        world_size=1,
        tokenizer_or_tokenizer_name=task["tokenizer"],
    )
    assert len(sft) == 1500
    sample = sft[0]
    ids, mask = sample.data["packed_input_ids"].tolist(), sample.data["prompt_mask"].tolist()
    first = rows(task, "sft_train")[0]
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == first["prompt"]
    assert tok.decode([i for i, m in zip(ids, mask) if not m], skip_special_tokens=True) == first["answer"]
    assert ids[-1] == tok.eos_token_id
    rl = make_dataset(
        DatasetAbstraction("prompt", {"dataset_path": task["rl_valid"], "metadata_keys": ["answer"]}),
        seed=1,
        dp_rank=0,
        world_size=1,
        tokenizer_or_tokenizer_name=task["tokenizer"],
    )
    assert len(rl) == 200
    assert rl[0].metadata == {"answer": [rows(task, "rl_valid")[0]["answer"]]}


def test_model_config_fits_the_task():
    cfg = arith_model_config()
    assert cfg["vocab_size"] == len(TOKENS) and cfg["n_positions"] >= 7 + 5  # "99+99=?" + "####198" + EOS
    assert cfg["hidden_dim"] % cfg["n_q_heads"] == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ops": ("/",)}, "ops must be"),
        ({"ops": ()}, "ops must be"),
        ({"teacher_error_rate": 1.5}, "teacher_error_rate"),
        ({"carry_fraction": -0.1}, "carry_fraction"),
        ({"n_valid": 0}, "n_valid"),
        ({"max_operand": 1000}, "max_operand"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArithTaskConfig(**kwargs)


def test_multiplication_option(tmp_path):
    paths = build_arith_task(
        str(tmp_path / "mul"), ArithTaskConfig(ops=("*",), n_valid=100, n_train=300, n_sft_train=300)
    )
    valid = rows(paths, "rl_valid")
    assert 0 < len(valid) <= int(169 * 0.2) + 1  # at most a fifth of the table is held out
    for row in valid + rows(paths, "rl_train"):
        a, op, b = problem(row["prompt"])
        assert op == "*" and row["answer"] == str(a * b) and max(a, b) <= 12
