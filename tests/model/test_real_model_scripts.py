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


def test_phases_choose_the_files_and_leave_the_questions_to_them(tmp_path):
    """``--phases rl``: only rl_train and rl_valid are written, so a small task can hold out more
    (the 800 questions of '+*' below 20: 500 held out, 300 to train on)."""
    arith = load("make_arith_prompts")
    args = ["--format", "messages", "--ops", "+*", "--max-operand", "20", "--out", str(tmp_path)]
    assert arith.main([*args, "--phases", "rl", "--n-rl", "300", "--n-valid", "500"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rl_train.jsonl", "rl_valid.jsonl"]
    questions = [
        json.loads(line)["prompt"][0]["content"]
        for name in ("rl_train", "rl_valid")
        for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()
    ]
    assert len(questions) == len(set(questions)) == 800
    with pytest.raises(SystemExit, match="1300 distinct questions asked for but only 800"):
        arith.main([*args, "--phases", "sft,rl", "--n-sft", "0", "--n-rl", "300", "--n-valid", "500"])
    with pytest.raises(SystemExit):
        arith.main([*args, "--phases", "ppo"])


def test_evaluate_takes_an_adapter_with_transformers_only(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("")
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "evaluate.py"),
            str(tmp_path),
            "--data",
            str(data),
            "--adapter",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "--adapter needs --hf" in proc.stderr


def test_recipe_names_a_folder_that_is_not_a_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "recipe.py"), "--model", str(tmp_path), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"error: --model {tmp_path} is not an HF folder")
    assert not (tmp_path / "o").exists()  # refused before anything is written
