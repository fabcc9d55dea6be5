"""``word_sentiment``: a configurable rule-based reward (the toy task's hidden true reward).

score = (# positive words) - (# negative words) in the completion, plus ``missing_end_penalty``
when the completion does not end with ``end_token`` (the toy task: -2 without the final '.').
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from realrl.api.core.model_api import register_reward_fn

DEFAULT_POSITIVE_WORDS = (
    "good",
    "great",
    "happy",
    "love",
    "excellent",
    "nice",
    "wonderful",
    "best",
    "kind",
    "joy",
)
DEFAULT_NEGATIVE_WORDS = (
    "bad",
    "terrible",
    "sad",
    "hate",
    "awful",
    "worst",
    "poor",
    "horrible",
    "cruel",
    "pain",
)
_WORD = re.compile(r"[\w']+")


def word_sentiment_reward(
    prompts: list[str],
    completions: list[str],
    *,
    positive_words: Iterable[str] = DEFAULT_POSITIVE_WORDS,
    negative_words: Iterable[str] = DEFAULT_NEGATIVE_WORDS,
    end_token: str | None = ".",
    missing_end_penalty: float = -2.0,
    per_words: int | None = None,
    **metadata,
) -> list[float]:
    """Count words (case-insensitive, split on non-word characters); metadata is ignored.
    ``per_words``: the count per that many words instead (a density: longer answers earn no
    more), so a policy cannot raise its reward by writing longer."""
    pos = {w.lower() for w in positive_words}
    neg = {w.lower() for w in negative_words}
    scores = []
    for text in completions:
        words = _WORD.findall(text.lower())
        score = float(sum(w in pos for w in words) - sum(w in neg for w in words))
        if per_words is not None:
            score = score * per_words / max(len(words), 1)
        if end_token and not text.rstrip().endswith(end_token):
            score += missing_end_penalty
        scores.append(score)
    return scores


register_reward_fn("word_sentiment", word_sentiment_reward)
