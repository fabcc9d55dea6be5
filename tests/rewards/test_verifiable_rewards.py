"""Verifiable rewards: answer extraction, numeric normalisation, string / regex / format checks,
weighted combinations, and the errors a misconfigured run gets."""

import pytest

import realrl.impl.rewards  # noqa: F401  (registers the reward functions)
from realrl.api.core.model_api import get_reward_fn, registered_reward_fns
from realrl.impl.rewards.answers import answers_match, extract_answer, parse_number, reference_answer
from realrl.impl.rewards.combine import combined_reward
from realrl.impl.rewards.format import format_reward
from realrl.impl.rewards.match import exact_match_reward, regex_match_reward
from realrl.impl.rewards.math_answer import math_answer_reward


def score(completion, answer, **kwargs):
    return math_answer_reward([""], [completion], answer=[answer], **kwargs)[0]


def test_all_names_registered():
    names = set(registered_reward_fns())
    assert {
        "math_answer",
        "gsm8k",
        "exact_match",
        "regex_match",
        "format",
        "combined",
        "weighted_sum",
    } <= names
    assert get_reward_fn("math_answer") is math_answer_reward
    assert get_reward_fn("weighted_sum") is combined_reward


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5"),
        ("so \\boxed{\\dfrac{3}{4}}.", "3/4"),
        ("$\\boxed{-\\frac{1}{2}}$", "-0.5"),
        ("nested: \\boxed{{7}}", "7"),
        ("\\boxed{x^{2}+1}", "x^{2} + 1"),
        ("first \\boxed{3}, then \\boxed{5}", "5"),
        ("#### 1,234", "1234"),
        ("It costs $5.00.", "5"),
        ("\\boxed{- 3}", "-3"),
        ("so x = -3", "- 3"),
        ("The total is 3.", "3"),
        ("\\boxed{2.50}", "2.5"),
        ("\\boxed{-0}", "0"),
        ("\\boxed{1e3}", "1000"),
        ("\\boxed{+7}", "7"),
        ("\\boxed{50\\%}", "50"),
        ("about \\boxed{1{,}000} people", "1000"),
        (
            "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18",
            "She makes 9 * 2 = $<<9*2=18>>18.\n#### 18",
        ),
        ("He has 72 now", "Natalia sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72"),
        ("answer: \\boxed{\\text{(B)}}", "(b)"),
        ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)"),
        ("####19", "19"),
        ("12-3=?####9", "9"),
    ],
)
def test_math_answer_correct(completion, answer):
    assert score(completion, answer) == 1.0


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("The answer is \\boxed{\\frac{1}{3}}", "0.33"),
        ("first \\boxed{5}, then \\boxed{3}", "5"),  # the last boxed answer counts
        ("#### 1,234", "1243"),
        ("I do not know.", "7"),  # no number at all
        ("", "0"),
        ("the result is 12-3", "-3"),  # a minus between numbers is not a sign
        ("so f(4)-3", "-3"),  # nor after a closing bracket
        ("\\boxed{1,2345}", "12345"),  # not a thousands separator
        ("\\boxed{(A)}", "(B)"),
        ("\\boxed{5} though some say 6", "6"),  # boxed beats the last number
        ("#### 4\nwait, 5", "5"),  # so does the GSM8K line
        ("\\boxed{3/0}", "0"),
    ],
)
def test_math_answer_wrong(completion, answer):
    assert score(completion, answer) == 0.0


def test_math_answer_options():
    assert score("it is 7", "7", fallback="none") == 0.0  # no boxed / #### answer to read
    assert score("\\boxed{7}", "7", fallback="none") == 1.0
    assert score("\\boxed{50%}", "0.5", percent="fraction") == 1.0
    assert score("\\boxed{50%}", "0.5") == 0.0
    assert score("\\boxed{0.3333}", "1/3") == 0.0
    assert score("\\boxed{0.3333}", "1/3", tolerance=1e-3) == 1.0
    assert score("\\boxed{9}", "9", correct_score=2.0) == 2.0
    assert score("\\boxed{8}", "9", wrong_score=-1.0) == -1.0
    assert score("no answer", "9", wrong_score=-1.0, no_answer_score=-2.0) == -2.0
    assert score("\\boxed{8}", 8) == 1.0  # a numeric reference (a JSON number in the row)
    with pytest.raises(ValueError, match="fallback"):
        score("7", "7", fallback="first_number")
    with pytest.raises(ValueError, match="percent"):
        score("7", "7", percent="keep")


def test_math_answer_batches_and_answer_key():
    out = math_answer_reward(
        ["q1", "q2", "q3"],
        ["\\boxed{1}", "#### 2", "3"],
        solution=["1", "x #### 5", "3"],
        answer_key="solution",
    )
    assert out == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("name", ["math_answer", "exact_match"])
def test_missing_answer_metadata_says_how_to_pass_it(name):
    with pytest.raises(ValueError, match=r"dataset\.metadata_keys=\[answer\]"):
        get_reward_fn(name)(["p"], ["c"], other=["x"])


@pytest.mark.parametrize(
    "answer, message",
    [("7", "one reference per completion"), (["7", "8"], "2 references"), ([None], "string or a number")],
)
def test_bad_answer_metadata(answer, message):
    with pytest.raises(ValueError, match=message):
        math_answer_reward(["p"], ["c"], answer=answer)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a \\boxed{x^{2}+1} b", "x^{2}+1"),
        ("\\boxed{\\{1\\}}", "\\{1\\}"),  # escaped braces do not count
        ("\\boxed{unclosed", None),
        ("\\boxed{2} and \\boxed{unclosed", "2"),  # an unclosed last box falls back to the previous
        ("steps...\n#### 72", "72"),
        ("#### 72 apples", "72"),
        ("numbers 1, 2 and 3.", "3"),
        ("6/8 of them", "6/8"),
        ("nothing here", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, value",
    [("1,234", 1234), ("$5.00", 5), ("3/4", 0.75), ("\\frac{3}{4}", 0.75), ("\\frac34", 0.75), ("-0", 0)]
    + [("2.", 2), ("1.5e-3", 0.0015), ("- 3", -3), ("+4", 4), ("{12}", 12), ("\\text{12}", 12)],
)
def test_parse_number(text, value):
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "1,2", "1/0", "x3", "nan", "inf", "1e", ""])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_reference_answer_and_text_compare():
    assert reference_answer("long solution\n#### 1,000") == "1,000"
    assert reference_answer("so \\boxed{42}") == "42"
    assert reference_answer("  Paris ") == "Paris"
    assert answers_match("\\text{ Paris }.", "paris")
    assert not answers_match("Paris", "London")


@pytest.mark.parametrize(
    "completion, answer, ignore_case, expected",
    [("  Paris\n", "Paris", False, 1.0), ("paris", "Paris", False, 0.0), ("paris", "Paris", True, 1.0)]
    + [("Paris!", "Paris", True, 0.0), ("42", 42, False, 1.0)],
)
def test_exact_match(completion, answer, ignore_case, expected):
    assert exact_match_reward([""], [completion], answer=[answer], ignore_case=ignore_case) == [expected]


@pytest.mark.parametrize(
    "pattern, completion, answer, expected",
    [
        (r"\d+", "it is 42", None, 1.0),
        (r"^\d+$", "it is 42", None, 0.0),
        (r"answer: {answer}$", "answer: 3.5", "3.5", 1.0),
        (r"answer: {answer}$", "answer: 3x5", "3.5", 0.0),  # the '.' of the answer is literal
        (r"\({answer}\)", "result (a+b)*c", "a+b", 1.0),
        (r"\({answer}\)", "result (aab)", "a+b", 0.0),  # the '+' of the answer is literal
        (r"costs \$?{answer}\b", "it costs $5", "5", 1.0),
        (r"\d{2}-{answer}", "10-7", "7", 1.0),  # regex braces beside the placeholder
    ],
)
def test_regex_match(pattern, completion, answer, expected):
    kwargs = {} if answer is None else {"answer": [answer]}
    assert regex_match_reward([""], [completion], pattern=pattern, **kwargs) == [expected]


def test_regex_match_options_and_errors():
    assert regex_match_reward([""], ["ABC"], pattern="abc", ignore_case=True) == [1.0]
    assert regex_match_reward([""], ["xabc"], pattern="abc", fullmatch=True) == [0.0]
    assert regex_match_reward([""], ["a\nb"], pattern="a.b", dotall=True, match_score=2.0) == [2.0]
    with pytest.raises(ValueError, match="non-empty pattern"):
        regex_match_reward([""], ["x"])
    with pytest.raises(ValueError, match="not a valid regular expression"):
        regex_match_reward([""], ["x"], pattern="(unclosed")
    with pytest.raises(ValueError, match=r"metadata_keys=\[answer\]"):
        regex_match_reward([""], ["x"], pattern="{answer}")


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>\nstep 1\nstep 2\n</think>\n<answer>\n42\n</answer>", 1.0),
        ("  <think>a</think><answer>b</answer>\n", 1.0),
        ("<think>a</think> <answer>b</answer> trailing", 0.0),
        ("<answer>b</answer>", 0.0),
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0),
        ("<think>a<think>b</think><answer>c</answer>", 0.0),
    ],
)
def test_format_think_answer(completion, expected):
    assert format_reward([""], [completion]) == [expected]


@pytest.mark.parametrize(
    "completion, style, expected",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}.", "boxed", 1.0),
        ("$\\boxed{7}$", "boxed", 1.0),
        ("\\boxed{7} and more words", "boxed", 0.0),
        ("\\boxed{\\frac{1}{2}", "boxed", 0.0),
        ("no box", "boxed", 0.0),
        ("work\nwork\n#### 1,234", "gsm8k", 1.0),
        ("#### 12 apples", "gsm8k", 0.0),
    ],
)
def test_format_styles(completion, style, expected):
    assert format_reward([""], [completion], style=style) == [expected]


def test_format_custom_pattern_spans_lines():
    pattern = r"Step \d+:.*\nAnswer: \d+"
    assert format_reward([""], ["Step 1: a\nb\nAnswer: 3"], pattern=pattern) == [1.0]
    assert format_reward([""], ["Step 1: a\nAnswer: 3\n extra"], pattern=pattern) == [0.0]
    with pytest.raises(ValueError, match="either pattern or style"):
        format_reward([""], ["x"], pattern="x", style="boxed")
    with pytest.raises(ValueError, match="style must be one of"):
        format_reward([""], ["x"], style="xml")


@pytest.mark.parametrize(
    "rewards, expected",
    [
        ({"math_answer": 1.0, "format": 0.5}, [1.5, 1.0, 0.0]),
        ({"math_answer": 2.0}, [2.0, 2.0, 0.0]),
        (
            [
                {"name": "math_answer", "weight": 1.0},
                {"name": "format", "weight": 0.25, "kwargs": {"style": "boxed"}},
            ],
            [1.0, 1.25, 0.25],
        ),
        ([{"name": "math_answer"}, {"name": "math_answer", "weight": -0.5}], [0.5, 0.5, 0.0]),
    ],
)
def test_combined_weights(rewards, expected):
    completions = ["<think>x</think><answer>7</answer>", "so \\boxed{7}", "\\boxed{8}"]
    out = get_reward_fn("combined")(["q"] * 3, completions, rewards=rewards, answer=["7"] * 3)
    assert out == pytest.approx(expected)


def test_combined_passes_own_kwargs_over_shared():
    rewards = [{"name": "math_answer", "kwargs": {"correct_score": 3.0}}, {"name": "exact_match"}]
    out = combined_reward([""], ["7"], rewards=rewards, answer=["7"], correct_score=10.0)
    assert out == [13.0]


@pytest.mark.parametrize(
    "rewards, message",
    [
        (
            {"math_answer": 1.0, "no_such_reward": 1.0},
            r"unknown reward function 'no_such_reward'.*math_answer",
        ),
        ([{"weight": 1.0}], "must be a mapping with a 'name'"),
        ([{"name": "format", "wieght": 1.0}], r"unknown keys \['wieght'\]"),
        ({"math_answer": "heavy"}, "must be a finite number"),
        ({"math_answer": float("nan")}, "must be a finite number"),
        ({}, "is empty"),
        (None, "needs reward_fn_kwargs.rewards"),
        ("math_answer", "needs reward_fn_kwargs.rewards"),
        ([{"name": "format", "kwargs": [1]}], "kwargs must be a mapping"),
    ],
)
def test_combined_errors(rewards, message):
    with pytest.raises(ValueError, match=message):
        combined_reward([""], ["x"], rewards=rewards, answer=["1"])


def test_combined_checks_every_name_before_calling_any(tmp_path):
    marker = tmp_path / "called"
    plugin = tmp_path / "marking.py"
    plugin.write_text(
        f"def mark(prompts, completions, **kw):\n    open({str(marker)!r}, 'w').close()\n"
        "    return [0.0] * len(completions)\n"
    )
    with pytest.raises(ValueError, match="unknown reward function"):
        combined_reward([""], ["x"], rewards=[{"name": f"{plugin}:mark"}, {"name": "missing_one"}])
    assert not marker.exists()
    combined_reward([""], ["x"], rewards=[{"name": f"{plugin}:mark"}])
    assert marker.exists()


def test_combined_accepts_module_function(tmp_path):
    plugin = tmp_path / "my_reward.py"
    plugin.write_text(
        "def length(prompts, completions, **kw):\n    return [float(len(c)) for c in completions]\n"
    )
    out = combined_reward([""], ["abcd"], rewards={f"{plugin}:length": 0.5, "format": 1.0})
    assert out == [2.0]
