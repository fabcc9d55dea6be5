"""``rw_paired``: reward-modeling pairs packed as [c1, r1, c2, r2, ...] (DeepSpeed-Chat's phase 2;
TRL's row formats)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from realrl.api.core.data_api import DatasetUtility, register_dataset
from realrl.impl.dataset.base import RowDataset, Skip
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.preference import (
    PreferenceFields,
    preference_margins,
    preference_pairs,
    preference_texts,
)
from realrl.impl.dataset.samples import paired_sample
from realrl.impl.dataset.sources import DataSource


class RewardPairDataset(RowDataset):
    """Each item: one prompt's pairs as sequences of ``packed_input_ids`` [c1, r1, c2, r2, ...]
    and, when the rows have a ``margin`` field, ``margins`` (pair j's margin on both its sequences).

    Row formats follow TRL (see ``preference.py``). ``max_length`` leaves out a pair whose chosen or
    rejected side is longer (TRL's filter; nothing is truncated); a row with no pair left is left
    out; both are counted. A prompt with more than ``max_pairs_per_prompt`` pairs keeps a subset
    drawn from (seed, row id), so it is the same on every run.
    """

    dataset_name = "rw_paired"

    def __init__(
        self,
        util: DatasetUtility,
        dataset_path: DataSource | None = None,
        dataset_builder: Callable[[], Any] | None = None,
        split: str | None = None,
        prompt_key: str = "prompt",
        chosen_key: str = "chosen",
        rejected_key: str = "rejected",
        margin_key: str | None = "margin",
        max_length: int | None = 1024,
        max_pairs_per_prompt: int | None = 2,
        id_key: str | None = None,
        metadata_keys: Sequence[str] = (),
    ):
        if max_pairs_per_prompt is not None and max_pairs_per_prompt < 1:
            raise ValueError(
                f"rw_paired: max_pairs_per_prompt must be >= 1 or None, got {max_pairs_per_prompt}"
            )
        self.fields = PreferenceFields(prompt_key, chosen_key, rejected_key, margin_key or "")
        self.margin_key = margin_key
        self.max_length = max_length
        self.max_pairs_per_prompt = max_pairs_per_prompt
        self.has_margins: bool | None = None
        super().__init__(util, dataset_path, dataset_builder, split, id_key, metadata_keys)

    def row_texts(self, row):
        return [(t, True) for t in preference_texts(row, self.fields, self.tok.eos_token)]

    def build_row(self, row, where, id_, meta, dropped):
        margin_key, max_length = self.margin_key, self.max_length
        if self.has_margins is None:  # decided by the first row, like TRL's collator
            self.has_margins = bool(margin_key) and margin_key in row
        elif not self.has_margins and margin_key and margin_key in row:
            raise DataError(f"{where}: field {margin_key!r} is set but this rank's first row has none")
        pairs = preference_pairs(self.tok, row, where, self.fields)
        margins = preference_margins(row, where, self.fields, len(pairs)) if self.has_margins else None
        keep = [
            j for j, (c, r) in enumerate(pairs) if max_length is None or max(len(c), len(r)) <= max_length
        ]
        if len(keep) < len(pairs):
            dropped[f"pairs longer than max_length={max_length}"] += len(pairs) - len(keep)
        if not keep:
            raise Skip(f"rows with no pair within max_length={max_length}")
        if self.max_pairs_per_prompt is not None and len(keep) > self.max_pairs_per_prompt:
            rng = np.random.default_rng([self.util.seed % 2**32, zlib.crc32(str(id_).encode())])
            keep = sorted(rng.choice(keep, self.max_pairs_per_prompt, replace=False).tolist())
        return paired_sample(
            id_,
            [pairs[j] for j in keep],
            None if margins is None else [margins[j] for j in keep],
            meta,
        )


register_dataset(RewardPairDataset.dataset_name, RewardPairDataset)
