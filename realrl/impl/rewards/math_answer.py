"""``math_answer`` (also ``gsm8k``): 1 when the completion's final answer equals the reference.

The reference comes from the dataset row's answer field (``dataset.metadata_keys=[answer]``) and
may be a bare answer (``"72"``, ``"\\frac{1}{2}"``) or a whole solution ending in GSM8K's
``#### 72`` or in a ``\\boxed{}`` answer.
"""

from __future__ import annotations

from typing import Any

from realrl.api.core.model_api import register_reward_fn
from realrl.impl.rewards.answers import (
    FALLBACKS,
    PERCENT_MODES,
    answers_match,
    extract_answer,
    reference_answer,
)
from realrl.impl.rewards.common import check_lengths, references


def math_answer_reward(
    prompts: list[str],
    completions: list[str],
    *,
    answer_key: str = "answer",
    fallback: str | None = "last_number",
    percent: str = "strip",
    tolerance: float = 0.0,
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
    no_answer_score: float | None = None,
    **metadata: Any,
) -> list[float]:
    """Score each completion against ``metadata[answer_key]`` (one reference per completion).

    The final answer is the last ``\\boxed{...}``, else the last ``#### n``, else (``fallback=
    "last_number"``; ``"none"`` turns it off) the last number in the text. Numbers compare by exact
    value (``"1,234"`` == ``"1234"``, ``"$5.00"`` == ``"5"``, ``"3/4"`` == ``"0.75"``; ``tolerance``: a
    relative tolerance instead), other answers as normalised text. ``percent="strip"`` reads
    ``"50%"`` as 50, ``"fraction"`` as 0.5. A completion with no answer at all scores
    ``no_answer_score`` (default: ``wrong_score``).
    """
    check_lengths("math_answer", prompts, completions)
    if fallback not in FALLBACKS and fallback is not None:
        raise ValueError(f"math_answer: fallback must be one of {FALLBACKS} or None, got {fallback!r}")
    if percent not in PERCENT_MODES:
        raise ValueError(f"math_answer: percent must be one of {PERCENT_MODES}, got {percent!r}")
    if tolerance < 0:
        raise ValueError(f"math_answer: tolerance must be >= 0, got {tolerance}")
    refs = references("math_answer", completions, metadata, answer_key)
    missing = wrong_score if no_answer_score is None else no_answer_score
    scores = []
    for completion, ref in zip(completions, refs):
        predicted = extract_answer(completion, fallback)
        if predicted is None:
            scores.append(float(missing))
        elif answers_match(predicted, reference_answer(ref), percent, tolerance):
            scores.append(float(correct_score))
        else:
            scores.append(float(wrong_score))
    return scores


register_reward_fn("math_answer", math_answer_reward)
register_reward_fn("gsm8k", math_answer_reward)
