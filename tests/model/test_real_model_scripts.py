"""The arithmetic data script's multi-step questions and the evaluation script's user errors
(``examples/real_model``); neither needs the SmolLM2 checkpoint."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "real_model"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "terms, value",
    [((3, "+", 4), 7), ((3, "-", 4, "*", 5), -17), ((2, "*", 3, "+", 4), 10), ((9, "-", 2, "-", 3), 4)],
)
def test_value_of_takes_products_first(terms, value):
    assert load("make_arith_prompts").value_of(terms) == value


def test_three_term_questions_are_distinct_and_answered_right(tmp_path):
    arith = load("make_arith_prompts")
    args = ["--format", "messages", "--terms", "3", "--max-operand", "10", "--n-sft", "20", "--n-rw", "0"]
    assert arith.main([*args, "--out", str(tmp_path), "--n-rl", "30", "--n-valid", "10"]) == 0
    seen = []
    for name in ("sft", "sft_valid", "rl_train", "rl_valid"):
        for line in (tmp_path / f"{name}.jsonl").read_text().splitlines():
            row = json.loads(line)
            question = row["prompt"][0]["content"]
            expr = question.removeprefix("What is ").split("?")[0]
            parts = expr.split()
            assert len(parts) == 5
            terms = tuple(int(p) if i % 2 == 0 else p for i, p in enumerate(parts))
            answer = (
                row["answer"] if name.startswith("rl") else row["answer"][0]["content"].split("#### ")[-1]
            )
            assert int(answer) == arith.value_of(terms)
            seen.append(expr)
    assert len(seen) == len(set(seen)) == 20 + 10 + 30 + 10


def test_evaluate_names_a_missing_checkpoint(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("")
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "evaluate.py"), str(tmp_path / "nope"), "--data", str(data)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: checkpoint {tmp_path / 'nope'} does not exist"
