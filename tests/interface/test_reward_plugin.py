"""Reward plugins: resolution by name / module / file, batching, metadata, and every error path."""

import math
import os

import pytest
import torch
from interface_fixtures import make_model, prompt_answer_batch

from realrl.api.core.config import ModelInterfaceAbstraction
from realrl.api.core.model_api import make_interface, register_reward_fn
from realrl.impl.interface.reward_plugin import RewardFunctionError, resolve_reward_fn
from realrl.impl.interface.rule_reward import word_sentiment_reward

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "reward_plugin.py")
PAIRS = [("w1 w2", "good great ."), ("w3", "bad w4 good"), ("w5", "awful .")]


def plugin(fn: str, **kw):
    return make_interface(ModelInterfaceAbstraction("reward_fn", {"fn": fn, **kw}))


def test_word_sentiment_counts_words_and_penalises_a_missing_end():
    scores = word_sentiment_reward(["p"] * 4, ["good great .", "bad good", "Awful, bad.", ""])
    assert scores == [2.0, 0.0 - 2.0, -2.0, -2.0]
    custom = word_sentiment_reward(
        ["p"], ["zip zap"], positive_words=["zip"], negative_words=[], end_token=None, missing_end_penalty=-9
    )
    assert custom == [1.0]


def test_reward_fn_interface_scores_decoded_completions(tokenizer):
    model = make_model(tokenizer, role="reward", train=False)
    batch = prompt_answer_batch(tokenizer, PAIRS)
    out = plugin("word_sentiment").inference(model, batch)
    assert out.seqlens["rewards"] == [[1], [1], [1]]
    assert out.data["rewards"].tolist() == [2.0, -2.0, -1.0]


def test_resolution_by_module_and_by_file(tokenizer):
    assert (
        resolve_reward_fn("realrl.impl.interface.rule_reward:word_sentiment_reward") is word_sentiment_reward
    )
    fn = resolve_reward_fn(f"{EXAMPLE}:echo_and_brevity_reward")
    assert fn(["a b"], ["a b c d"], target_words=4) == [2.0]
    model = make_model(tokenizer, role="reward", train=False)
    out = plugin(f"{EXAMPLE}:echo_and_brevity_reward", fn_kwargs={"target_words": 3}).inference(
        model, prompt_answer_batch(tokenizer, PAIRS)
    )
    assert out.data["rewards"].tolist() == pytest.approx([0.0, 0.0, -1 / 3])
    with pytest.raises(RewardFunctionError, match="cannot load reward function"):
        resolve_reward_fn("no_such_module_xyz:fn")
    with pytest.raises(RewardFunctionError, match="no such file"):
        resolve_reward_fn("/nonexistent/plugin.py:fn")
    with pytest.raises(LookupError, match="word_sentiment"):
        resolve_reward_fn("not_registered_name")


def test_batches_and_per_sequence_metadata(tokenizer):
    calls = []

    def spy(prompts, completions, topic, **kw):
        calls.append((list(prompts), list(topic)))
        return [float(len(c.split())) for c in completions]

    register_reward_fn("test_spy_reward", spy)
    model = make_model(tokenizer, role="reward", train=False)
    batch = prompt_answer_batch(tokenizer, PAIRS)
    batch.metadata["topic"] = ["x", "y", "z"]
    out = plugin("test_spy_reward", batch_size=2).inference(model, batch)
    assert out.data["rewards"].tolist() == [3.0, 3.0, 2.0]
    assert calls == [(["w1 w2", "w3"], ["x", "y"]), (["w5"], ["z"])]


@pytest.mark.parametrize(
    "name,body,match",
    [
        (
            "test_raises",
            lambda p, c, **k: [1 / 0 for _ in c],
            r"raised ZeroDivisionError.*sample ids \[0, 1, 2\]",
        ),
        ("test_short", lambda p, c, **k: [1.0], r"returned 1 scores for 3 completions.*ids \[0, 1, 2\]"),
        ("test_nan", lambda p, c, **k: [1.0, math.nan, 2.0], r"not finite numbers for sample ids \[1: nan\]"),
        ("test_text", lambda p, c, **k: [1.0, 2.0, "3"], r"not finite numbers for sample ids \[2: '3'\]"),
        ("test_bool", lambda p, c, **k: [True, 2.0, 3.0], r"not finite numbers for sample ids \[0: True\]"),
        ("test_none", lambda p, c, **k: None, r"returned NoneType, not a list"),
    ],
)
def test_bad_plugins_stop_with_ids(tokenizer, name, body, match):
    register_reward_fn(name, body)
    model = make_model(tokenizer, role="reward", train=False)
    with pytest.raises(RewardFunctionError, match=match):
        plugin(name).inference(model, prompt_answer_batch(tokenizer, PAIRS))


def test_plugin_traceback_is_carried(tokenizer):
    def deep_failure(prompts, completions, **kw):
        raise KeyError("missing_field_in_plugin")

    register_reward_fn("test_deep_failure", deep_failure)
    model = make_model(tokenizer, role="reward", train=False)
    with pytest.raises(RewardFunctionError) as info:
        plugin("test_deep_failure").inference(model, prompt_answer_batch(tokenizer, PAIRS))
    msg = str(info.value)
    assert "plugin traceback" in msg and "deep_failure" in msg and "missing_field_in_plugin" in msg


def test_tensor_return_is_accepted(tokenizer):
    register_reward_fn("test_tensor", lambda p, c, **k: torch.arange(len(c), dtype=torch.float32))
    model = make_model(tokenizer, role="reward", train=False)
    out = plugin("test_tensor").inference(model, prompt_answer_batch(tokenizer, PAIRS))
    assert out.data["rewards"].tolist() == [0.0, 1.0, 2.0]
