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
    _draw_problems,
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
        assert json.load(f)["counts"] == {
            "sft_train": 2000,
            "sft_valid": 200,
            "rl_train": 400,
            "rl_valid": 200,
        }


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


def test_teacher_rows_are_tool_trajectories(task):
    """Every tool turn is the calculator's answer to the call before it; a row without a call is a
    +/- problem done in the head; the teacher is right on part of the rows only."""
    for row in rows(task, "sft_train"):
        p = parse_prompt(row["prompt"])
        turns = row["answer"]
        assert [t["role"] for t in turns] == ["assistant", "tool"] * (len(turns) // 2) + ["assistant"]
        if len(turns) == 1:
            assert additive(p) and parse_answer(turns[0]["content"]) == mental_value(p)
        for call, result in zip(turns[:-1:2], turns[1::2]):
            a, op, b = parse_call(call["content"])
            assert result["content"] == f"={evaluate((a, b), (op,))}"
    with open(task["manifest"]) as f:
        assert 0.2 < json.load(f)["teacher_accuracy"] < 0.6


def test_teacher_slips_at_the_configured_rates():
    cfg = CalcTaskConfig(seed=3, **SMALL)
    rng = np.random.default_rng(0)
    problems = _draw_problems(cfg, 3000, rng, set())
    trajs = [teacher_trajectory(p, cfg, rng) for p in problems]
    for kind, eligible, rate in (
        ("skip", additive, cfg.skip_rate),
        ("precedence", precedence_matters, cfg.precedence_slip_rate),
    ):
        hits = [
            kind in t.slips
            for p, t in zip(problems, trajs)
            if eligible(p) and (kind == "skip" or len(t.turns) > 1)
        ]
        assert abs(sum(hits) / len(hits) - rate) < 0.05, kind
    lucky = 0  # right despite a tool slip (two swaps that cancel, a product by 1)
    for p, t in zip(problems, trajs):
        calls = [parse_call(m["content"]) for m in t.turns[:-1:2]]
        if not t.slips:
            assert t.value == p.value and all(right_calls(p, calls))
        lucky += t.slips not in ((), ("skip",)) and t.value == p.value
        if t.slips == ("precedence",):
            assert not all(right_calls(p, calls))
    assert lucky < 0.01 * len(problems)


def test_teacher_mistakes():
    cfg = CalcTaskConfig(skip_rate=0.0, precedence_slip_rate=1.0, copy_slip_rate=1.0)
    t = teacher_trajectory(Problem((5, 37, 12), ("+", "*")), cfg, np.random.default_rng(0))
    assert [m["content"] for m in t.turns] == ["calc 5+37", "=42", "calc 42*12", "=504", "####540"]
    assert set(t.slips) == {"precedence", "copy"}
    assert (
        copy_slip(449) == 494 and copy_slip(44) == 44 and copy_slip(1900) == 1900 and copy_slip(-123) == -132
    )
    assert mental_value(Problem((47, 38, 5), ("+", "+"))) == 70  # 47+38 -> 75, +5 -> 70: no carries
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
    turns = {
        str(i): [t["content"] for t in row["answer"] if t["role"] == "assistant"]
        for i, row in enumerate(teacher)
    }

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
    trajs, _ = roll_out(
        prompts, [str(i) for i in range(len(teacher))], envs, tok, TurnBudget(4, 12, 64), replay, 10.0
    )
    for s, t, row in zip(samples, trajs, teacher):
        assert s.data["packed_input_ids"].tolist() == t.tokens
        mask = s.data["prompt_mask"].tolist()
        assert [not m for m in mask] == t.model_mask  # observations and prompt: no loss
        assert t.reward == float(
            parse_answer(row["answer"][-1]["content"]) == parse_prompt(row["prompt"]).value
        )
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


def test_the_task_recipes_set_the_environment_and_turn_budget(tmp_path):
    from realrl.apps.configs import build_config  # the command line's composition, as a user's run

    cfg = build_config("grpo", [f"fileroot={tmp_path}", "task=calc"])
    assert cfg.trial_name == "calc-seed1" and cfg.env == "calc" and cfg.reward_fn is None
    assert cfg.ppo.max_turns == 4 and cfg.ppo.gen.n == 8 and cfg.ppo.gen.max_new_tokens == 12
    assert cfg.dataset.metadata_keys == ["answer"] and cfg.dataset.path.endswith("rl_train.jsonl")
    assert cfg.actor.path.endswith(os.path.join("sft", "calc-seed1", "checkpoints", "default", "final"))
    sft = build_config("sft", [f"fileroot={tmp_path}", "task=calc"])
    assert sft.dataset.train_path.endswith("sft_train.jsonl")
    assert sft.dataset.max_seqlen <= calc_model_config()["n_positions"]
