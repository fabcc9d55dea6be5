"""The toy task's vocabulary and the Hugging Face tokenizer folder built from it."""

from __future__ import annotations

import dataclasses
import itertools

from realrl.impl.dataset.toy.word_tokenizer import BOS, EOS, PAD, UNK, save_word_level_tokenizer

POSITIVE = (
    "good great happy joy love nice kind bright calm brave "
    "fresh gentle lucky proud sweet warm wise fair glad hope"
).split()
NEGATIVE = (
    "bad sad angry hate awful cruel dark cold fear grim harsh lost mean pain rude sick sour ugly weak worse"
).split()
SEPARATOR = "|"
PERIOD = "."
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)


def _neutral_words(n: int) -> list[str]:
    """Pronounceable, deterministic filler words that collide with no sentiment word."""
    onsets, vowels, codas = "bdfgklmnprstvz", "aeiou", ("", "n", "r", "s", "l")
    taken = set(POSITIVE) | set(NEGATIVE)
    words = []
    for o1, v1, o2, v2, c in itertools.product(onsets, vowels, onsets, vowels, codas):
        w = o1 + v1 + o2 + v2 + c
        if w not in taken:
            words.append(w)
        if len(words) == n:
            return words
    raise ValueError(f"cannot make {n} neutral words")


@dataclasses.dataclass(frozen=True)
class ToyVocab:
    n_neutral: int = 160

    @property
    def positive(self) -> tuple[str, ...]:
        return tuple(POSITIVE)

    @property
    def negative(self) -> tuple[str, ...]:
        return tuple(NEGATIVE)

    @property
    def neutral(self) -> tuple[str, ...]:
        return tuple(_neutral_words(self.n_neutral))

    @property
    def content_words(self) -> tuple[str, ...]:
        """Words the bigram generator may emit (the period ends a response)."""
        return self.positive + self.negative + self.neutral

    @property
    def tokens(self) -> tuple[str, ...]:
        return SPECIAL_TOKENS + (SEPARATOR, PERIOD) + self.content_words

    def save_tokenizer(self, folder: str) -> str:
        """Write a ``PreTrainedTokenizerFast`` folder that ``AutoTokenizer`` loads offline."""
        from tokenizers import decoders, pre_tokenizers

        return save_word_level_tokenizer(
            folder,
            self.tokens,
            pre_tokenizers.WhitespaceSplit(),
            decoders.WordPiece(prefix="##", cleanup=False),  # words joined by single spaces
            {"toy_vocab.json": {"positive": POSITIVE, "negative": NEGATIVE, "n_neutral": self.n_neutral}},
        )
