"""``format``: does the completion have the required shape (a reasoning/answer template, a final
boxed answer, a GSM8K answer line)? A small shaping reward to add to a correctness reward."""

from __future__ import annotations

import re
from typing import Any

from realrl.api.core.model_api import register_reward_fn
from realrl.impl.rewards.answers import braced
from realrl.impl.rewards.common import check_lengths

# <think>...</think> then <answer>...</answer>, nothing around them, no nested or repeated tags
THINK_ANSWER = r"<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>|</?think>).)*</answer>"
GSM8K_LINE = r".*####[ \t]*[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
STYLES = ("think_answer", "boxed", "gsm8k")

_BOXED_AT_END = re.compile(r"\\boxed\s*\{")
_AFTER_BOXED = re.compile(r"\s*\$*\s*\.?\s*\$*")


def ends_with_boxed(text: str) -> bool:
    """The text's last ``\\boxed{...}`` closes its braces and only ``$``, ``.`` or spaces follow."""
    starts = list(_BOXED_AT_END.finditer(text))
    if not starts:
        return False
    m = starts[-1]
    inner = braced(text, m.end() - 1)
    if inner is None or not inner.strip():
        return False
    rest = text[m.end() + len(inner) + 1 :]
    return _AFTER_BOXED.fullmatch(rest) is not None


def format_reward(
    prompts: list[str],
    completions: list[str],
    *,
    style: str | None = None,
    pattern: str | None = None,
    strip: bool = True,
    match_score: float = 1.0,
    no_match_score: float = 0.0,
    **metadata: Any,
) -> list[float]:
    """``match_score`` when the whole completion has the required form, else ``no_match_score``.

    ``pattern``: a regular expression the whole completion must match (``re.fullmatch`` with
    ``re.DOTALL``, so ``.`` spans lines). Or ``style``: ``"think_answer"`` (the default:
    ``<think>...</think>`` then ``<answer>...</answer>``), ``"boxed"`` (ends with a ``\\boxed{}``
    answer, braces balanced) or ``"gsm8k"`` (ends with a ``#### n`` line). ``strip`` ignores
    whitespace around the completion. Metadata is ignored.
    """
    check_lengths("format", prompts, completions)
    if pattern is not None and style is not None:
        raise ValueError("format: give either pattern or style, not both")
    if pattern is None:
        style = style or "think_answer"
        if style not in STYLES:
            raise ValueError(f"format: style must be one of {STYLES}, got {style!r}")
        if style == "boxed":
            texts = [c.strip() if strip else c for c in completions]
            return [float(match_score if ends_with_boxed(t) else no_match_score) for t in texts]
        pattern = THINK_ANSWER if style == "think_answer" else GSM8K_LINE
    try:
        regex = re.compile(pattern, re.DOTALL)
    except re.error as e:
        raise ValueError(f"format: pattern {pattern!r} is not a valid regular expression: {e}") from None
    scores = []
    for completion in completions:
        text = completion.strip() if strip else completion
        scores.append(float(match_score if regex.fullmatch(text) else no_match_score))
    return scores


register_reward_fn("format", format_reward)
