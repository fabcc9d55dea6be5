"""Padded batches for users who want them (realrl itself trains on packed batches).

``DataCollatorForPreference`` gives the outputs of TRL's collator of that name: ``input_ids`` and
``attention_mask`` of shape (2N, L), the N chosen rows then the N rejected rows, right-padded, L
rounded up to ``pad_to_multiple_of``; ``margin`` (N,) float when the first example has one.
Nothing is truncated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from realrl.api.core.data_api import SequenceSample
from realrl.impl.dataset.samples import pairs_of

_SPELLINGS = [("chosen_ids", "rejected_ids"), ("chosen_input_ids", "rejected_input_ids")]


def pad_right(seqs: Sequence[Sequence[int]], value: int, multiple_of: int | None = None) -> torch.Tensor:
    """(len(seqs), L) tensor, each row left-aligned; L = longest, rounded up to ``multiple_of``."""
    length = max(len(s) for s in seqs)
    if multiple_of is not None and length % multiple_of:
        length += multiple_of - length % multiple_of
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out


@dataclasses.dataclass
class DataCollatorForPreference:
    """Stack (chosen, rejected) examples into one padded batch, chosen rows first."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        if self.return_tensors != "pt":
            raise ValueError(
                f"DataCollatorForPreference: only return_tensors='pt' is supported, got {self.return_tensors!r}"
            )
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1 or None, got {self.pad_to_multiple_of}")

    @staticmethod
    def _pair(example: dict[str, Any], i: int) -> tuple[Any, Any]:
        for c, r in _SPELLINGS:
            if c in example and r in example:
                return example[c], example[r]
        raise ValueError(
            f"example {i} has neither chosen_ids/rejected_ids nor chosen_input_ids/rejected_input_ids "
            f"(keys: {sorted(example)})"
        )

    def __call__(
        self, examples: Sequence[dict[str, Any]], return_tensors: str | None = None
    ) -> dict[str, torch.Tensor]:
        if (return_tensors or self.return_tensors) != "pt":
            raise ValueError(
                f"DataCollatorForPreference: only return_tensors='pt' is supported, got {return_tensors!r}"
            )
        if not examples:
            raise ValueError("DataCollatorForPreference: empty list of examples")
        pairs = [self._pair(e, i) for i, e in enumerate(examples)]
        seqs = [c for c, _ in pairs] + [r for _, r in pairs]
        out = {
            "input_ids": pad_right(seqs, self.pad_token_id, self.pad_to_multiple_of),
            "attention_mask": pad_right([[1] * len(s) for s in seqs], 0, self.pad_to_multiple_of),
        }
        if "margin" in examples[0]:
            out["margin"] = torch.tensor([float(e["margin"]) for e in examples], dtype=torch.float)
        return out


def preference_examples(samples: Sequence[SequenceSample]) -> list[dict[str, Any]]:
    """``rw_paired`` items -> TRL-style examples (one per pair) for ``DataCollatorForPreference``."""
    out = []
    for s in samples:
        margins = s.data["margins"].tolist()[0::2] if "margins" in s.keys else None
        for j, (c, r) in enumerate(pairs_of(s)):
            ex: dict[str, Any] = {"chosen_ids": c, "rejected_ids": r}
            if margins is not None:
                ex["margin"] = margins[j]
            out.append(ex)
    return out
