"""``exact_match`` and ``regex_match``: string checks of a completion, optionally against the
dataset row's reference answer."""

from __future__ import annotations

import re
from typing import Any

from realrl.api.core.model_api import register_reward_fn
from realrl.impl.rewards.common import check_lengths, references

ANSWER_PLACEHOLDER = "{answer}"


def exact_match_reward(
    prompts: list[str],
    completions: list[str],
    *,
    answer_key: str = "answer",
    ignore_case: bool = False,
    strip: bool = True,
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
    **metadata: Any,
) -> list[float]:
    """``correct_score`` when the completion equals ``metadata[answer_key]`` after stripping
    surrounding whitespace (``strip``) and case folding (``ignore_case``); for answers that must be
    reproduced verbatim (labels, names), where ``math_answer``'s number reading would be wrong."""
    check_lengths("exact_match", prompts, completions)
    refs = references("exact_match", completions, metadata, answer_key)

    def norm(s: str) -> str:
        s = s.strip() if strip else s
        return s.casefold() if ignore_case else s

    return [float(correct_score if norm(c) == norm(r) else wrong_score) for c, r in zip(completions, refs)]


def _flags(ignore_case: bool, dotall: bool, multiline: bool) -> int:
    return (
        (re.IGNORECASE if ignore_case else 0)
        | (re.DOTALL if dotall else 0)
        | (re.MULTILINE if multiline else 0)
    )


def _compile(pattern: str, flags: int) -> re.Pattern:
    try:
        return re.compile(pattern, flags)
    except re.error as e:
        raise ValueError(f"regex_match: pattern {pattern!r} is not a valid regular expression: {e}") from None


def regex_match_reward(
    prompts: list[str],
    completions: list[str],
    *,
    pattern: str | None = None,
    answer_key: str = "answer",
    fullmatch: bool = False,
    ignore_case: bool = False,
    dotall: bool = False,
    multiline: bool = False,
    match_score: float = 1.0,
    no_match_score: float = 0.0,
    **metadata: Any,
) -> list[float]:
    """``match_score`` when ``re.search(pattern, completion)`` (``re.fullmatch`` with
    ``fullmatch``) matches. ``{answer}`` in the pattern stands for the row's reference answer
    (``metadata[answer_key]``), regex-escaped, so ``"answer: {answer}$"`` checks a stated answer
    literally even when it holds ``.``, ``$`` or ``(``."""
    check_lengths("regex_match", prompts, completions)
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"regex_match needs a non-empty pattern (reward_fn_kwargs.pattern), got {pattern!r}")
    flags = _flags(ignore_case, dotall, multiline)
    if ANSWER_PLACEHOLDER in pattern:
        refs = references("regex_match", completions, metadata, answer_key)
        _compile(pattern.replace(ANSWER_PLACEHOLDER, "x"), flags)  # a bad pattern fails before any row
        regexes = [_compile(pattern.replace(ANSWER_PLACEHOLDER, re.escape(r.strip())), flags) for r in refs]
    else:
        regexes = [_compile(pattern, flags)] * len(completions)
    scores = []
    for regex, completion in zip(regexes, completions):
        hit = regex.fullmatch(completion) if fullmatch else regex.search(completion)
        scores.append(float(match_score if hit else no_match_score))
    return scores


register_reward_fn("exact_match", exact_match_reward)
register_reward_fn("regex_match", regex_match_reward)
