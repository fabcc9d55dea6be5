"""The calculator task: deterministic files, a round-tripping tokenizer, a teacher whose slips
come at the configured rates, the environment's rewards and observations, and SFT rows whose
tokens are exactly what a multi-turn rollout gives the same trajectory."""

import filecmp
import json
import os

import numpy as np
import pytest

from realrl.api.core.config import DatasetAbstraction
from realrl.api.core.data_api import load_hf_tokenizer, make_dataset
from realrl.api.core.env_api import resolve_env
from realrl.impl.dataset.toy.calc import (
    TOKENS,
    CalcTaskConfig,
    Problem,
    additive,
    build_calc_task,
    calc_model_config,
    calc_paths,
    copy_slip,
    evaluate,
    mental_value,
    parse_prompt,
    precedence_matters,
    right_calls,
    teacher_trajectory,
)
from realrl.impl.envs.calculator import CalculatorEnv, parse_answer, parse_call
from realrl.impl.interface.multi_turn import Sampled, TurnBudget, roll_out

SMALL = {"n_train": 400, "n_valid": 200, "n_sft_train": 2000}
FILES = ("sft_train", "sft_valid", "rl_train", "rl_valid")


def rows(paths, name):
    with open(paths[name]) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return build_calc_task(str(tmp_path_factory.mktemp("calc") / "seed3"), CalcTaskConfig(seed=3, **SMALL))


@pytest.fixture(scope="module")
def tok(task):
    return load_hf_tokenizer(task["tokenizer"])


def test_same_seed_same_files_other_seed_other_files(task, tmp_path):
    assert task == calc_paths(os.path.dirname(task["manifest"]))
    again = build_calc_task(str(tmp_path / "again"), CalcTaskConfig(seed=3, **SMALL))
    other = build_calc_task(str(tmp_path / "other"), CalcTaskConfig(seed=4, **SMALL))
    for name in FILES:
        assert filecmp.cmp(task[name], again[name], shallow=False), name
        assert not filecmp.cmp(task[name], other[name], shallow=False), name
    with open(task["manifest"]) as f:
        assert json.load(f)["counts"] == {"sft_train": 2000, "sft_valid": 200, "rl_train": 400, "rl_valid": 200}


def test_valid_problems_never_in_training_and_answers_are_true(task):
    valid = {r["prompt"] for r in rows(task, "rl_valid")}
    assert valid == {r["prompt"] for r in rows(task, "sft_valid")} and len(valid) == 200
    train = {r["prompt"] for r in rows(task, "rl_train")} | {r["prompt"] for r in rows(task, "sft_train")}
    assert not valid & train
    for row in rows(task, "rl_train") + rows(task, "rl_valid"):
        p = parse_prompt(row["prompt"])
        assert p is not None and len(p.ops) in (2, 3) and p.text() == row["prompt"]
        assert row["answer"] == str(p.value) and 0 <= p.value <= 9999


@pytest.mark.parametrize(
    "text, value", [("37*12+5=?", 449), ("5+37*12=?", 449), ("50-3*4-6=?", 32), ("2*3*4+1=?", 25)]
)
def test_problems_evaluate_with_precedence(text, value):
    p = parse_prompt(text)
    assert p.value == value == evaluate(p.nums, p.ops) and p.text() == text
    assert precedence_matters(p) == (text in ("5+37*12=?", "50-3*4-6=?"))


def test_tokenizer_round_trips_one_token_per_symbol(task, tok):
    cfg = calc_model_config()
    assert len(tok) == cfg["vocab_size"] == len(TOKENS) and tok.eos_token_id == cfg["eos_token_id"]
    for row in rows(task, "sft_train")[:300]:
        for text in [row["prompt"]] + [t["content"] for t in row["answer"]]:
            ids = tok(text, add_special_tokens=True)["input_ids"]
            assert tok.unk_token_id not in ids and tok.decode(ids) == text
    assert tok.convert_ids_to_tokens(tok("calc 444+5")["input_ids"]) == ["calc", "4", "4", "4", "+", "5"]
    assert tok.convert_ids_to_tokens(tok("=err####-12")["input_ids"]) == ["=", "err", "####", "-", "1", "2"]


def test_teacher_slips_at_the_configured_rates(task):
    cfg = CalcTaskConfig(seed=3, **SMALL)
    skip = prec = n_add = n_prec = 0
    for row in rows(task, "sft_train"):
        p = parse_prompt(row["prompt"])
        turns = row["answer"]
        assert [t["role"] for t in turns] == ["assistant", "tool"] * (len(turns) // 2) + ["assistant"]
        final = parse_answer(turns[-1]["content"])
        if len(turns) == 1:  # skipped the tool: only on +/- problems, forgetting carries
            assert additive(p) and final == mental_value(p)
        calls = [parse_call(t["content"]) for t in turns[:-1:2]]
        for call, result in zip(calls, turns[1::2]):  # every tool turn is the calculator's answer
            assert call is not None and result["content"] == f"={evaluate(call[:1] + call[2:], call[1:2])}"
        n_add += additive(p)
        skip += len(turns) == 1
        if precedence_matters(p):
            n_prec += 1
            prec += not all(right_calls(p, calls)) and len(turns) > 1
    assert abs(skip / n_add - cfg.skip_rate) < 0.06
    assert abs(prec / n_prec - cfg.precedence_slip_rate) < 0.08
    with open(task["manifest"]) as f:
        accuracy = json.load(f)["teacher_accuracy"]
    assert 0.2 < accuracy < 0.6


def test_teacher_mistakes():
    cfg = CalcTaskConfig(skip_rate=0.0, precedence_slip_rate=1.0, copy_slip_rate=1.0)
    t = teacher_trajectory(Problem((5, 37, 12), ("+", "*")), cfg, np.random.default_rng(0))
    assert [m["content"] for m in t.turns] == ["calc 5+37", "=42", "calc 42*12", "=504", "####540"]
    assert set(t.slips) == {"precedence", "copy"}
    assert copy_slip(449) == 494 and copy_slip(44) == 44 and copy_slip(1900) == 1900 and copy_slip(-123) == -132
    assert mental_value(Problem((47, 38, 5), ("+", "+"))) == 80  # 47+38 -> 75 without the carry
    right = CalcTaskConfig(skip_rate=0.0, precedence_slip_rate=0.0, copy_slip_rate=0.0)
    t = teacher_trajectory(Problem((5, 37, 12), ("+", "*")), right, np.random.default_rng(0))
    assert [m["content"] for m in t.turns] == ["calc 37*12", "=444", "calc 5+444", "=449", "####449"]


def test_right_calls():
    p = Problem((5, 37, 12), ("+", "*"))
    assert right_calls(p, [(37, "*", 12), (5, "+", 444)]) == [True, True]
    assert right_calls(p, [(5, "+", 37), (42, "*", 12)]) == [False, False]
    assert right_calls(p, [None, (37, "*", 12), (5, "+", 445)]) == [False, True, False]
    assert right_calls(Problem((9, 2, 3), ("-", "+")), [(2, "+", 3)]) == [False]  # 9-(2+3) != 9-2+3


def test_environment_rewards_observations_and_errors():
    assert resolve_env("calc") is CalculatorEnv
    env = CalculatorEnv("37*12+5=?", answer="449", other_metadata="ignored")
    assert env.step("calc 37*12") == ("=444", 0.0, False)
    assert env.step("calc37 * 12 + 5") == ("=err", 0.0, False)  # one operation per call
    assert env.step("hello") == ("=err", 0.0, False)
    assert env.step("calc 444+5") == ("=449", 0.0, False)
    assert env.step("####449") == (None, 1.0, True)
    assert [c.ok for c in env.calls] == [True, False, False, True] and env.final == 449
    assert CalculatorEnv("5-9=?", "0").step("calc 5-9") == ("=-4", 0.0, False)
    assert CalculatorEnv("5-9=?", "0").step("calc 1234567+1") == ("=err", 0.0, False)
    for text, reward in (("####450", 0.0), ("####", 0.0), ("#### 449", 1.0)):
        wrong = CalculatorEnv("37*12+5=?", answer="449")
        assert wrong.step(text) == (None, reward, True) and wrong.answered


def test_sft_rows_are_the_rollout_tokens(task, tok):
    """A rollout that replays the teacher's turns through the environment gives exactly the SFT
    row's tokens, and the tokens the model sampled are exactly the SFT row's trained tokens."""
    sft = make_dataset(
        DatasetAbstraction("prompt_answer", {"dataset_path": task["sft_train"]}),
        seed=1,
        dp_rank=0,
        world_size=1,
        tokenizer_or_tokenizer_name=task["tokenizer"],
    )
    teacher = rows(task, "sft_train")[:64]
    samples = [sft[i] for i in range(len(teacher))]
    assert [s.ids[0] for s in samples] == list(range(len(teacher)))
    turns = {str(i): [t["content"] for t in row["answer"] if t["role"] == "assistant"] for i, row in enumerate(teacher)}

    def replay(contexts, keys, max_new_tokens):
        out = []
        for key in keys:
            i, turn = key.split("/turn")
            ids = tok(turns[i][int(turn) - 1], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            out.append(Sampled(ids, [0.0] * len(ids), False))
        return out

    prompts = [tok(row["prompt"])["input_ids"] for row in teacher]
    truth = [str(parse_prompt(row["prompt"]).value) for row in teacher]
    envs = [CalculatorEnv(row["prompt"], a) for row, a in zip(teacher, truth)]
    trajs, _ = roll_out(prompts, [str(i) for i in range(len(teacher))], envs, tok, TurnBudget(4, 12, 64), replay, 10.0)
    for s, t, row in zip(samples, trajs, teacher):
        assert s.data["packed_input_ids"].tolist() == t.tokens
        mask = s.data["prompt_mask"].tolist()
        assert [not m for m in mask] == t.model_mask  # observations and prompt: no loss
        assert t.reward == float(parse_answer(row["answer"][-1]["content"]) == parse_prompt(row["prompt"]).value)
        assert len(t.tokens) <= calc_model_config()["n_positions"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_ops": (4,)}, "n_ops must hold"),
        ({"skip_rate": 1.5}, "skip_rate must be in"),
        ({"min_operand": 50, "max_operand": 10}, "min_operand < max_operand"),
        ({"n_valid": 0}, "n_valid must be >= 1"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CalcTaskConfig(**kwargs)
