"""``rw_paired``: reward-modeling pairs packed as [c1, r1, c2, r2, ...] (DeepSpeed-Chat's phase 2;
TRL's row formats)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from realrl.api.core.data_api import DatasetUtility, register_dataset
from realrl.impl.dataset.base import SampleListDataset, Skip, owned_rows
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.preference import (
    PreferenceFields,
    preference_margins,
    preference_pairs,
    preference_texts,
)
from realrl.impl.dataset.samples import paired_sample
from realrl.impl.dataset.sources import DataSource
from realrl.impl.dataset.tokenize import BatchTokenizer


class RewardPairDataset(SampleListDataset):
    """Each item: one prompt's pairs as sequences of ``packed_input_ids`` [c1, r1, c2, r2, ...]
    and, when the rows have a ``margin`` field, ``margins`` (pair j's margin on both its sequences).

    Row formats follow TRL (see ``preference.py``). ``max_length`` leaves out a pair whose chosen or
    rejected side is longer (TRL's filter; nothing is truncated); a row with no pair left is left
    out; both are counted. A prompt with more than ``max_pairs_per_prompt`` pairs keeps a subset
    drawn from (seed, row id), so it is the same on every run.
    """

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
        fields = PreferenceFields(prompt_key, chosen_key, rejected_key, margin_key or "")
        tok = BatchTokenizer(util.tokenizer)
        self.has_margins: bool | None = None

        def texts(row):
            return [(t, True) for t in preference_texts(row, fields, tok.eos_token)]

        def build(row, where, id_, meta, dropped):
            if self.has_margins is None:  # decided by the first row, like TRL's collator
                self.has_margins = bool(margin_key) and margin_key in row
            elif not self.has_margins and margin_key and margin_key in row:
                raise DataError(f"{where}: field {margin_key!r} is set but this rank's first row has none")
            pairs = preference_pairs(tok, row, where, fields)
            margins = preference_margins(row, where, fields, len(pairs)) if self.has_margins else None
            keep = [
                j for j, (c, r) in enumerate(pairs) if max_length is None or max(len(c), len(r)) <= max_length
            ]
            if len(keep) < len(pairs):
                dropped[f"pairs longer than max_length={max_length}"] += len(pairs) - len(keep)
            if not keep:
                raise Skip(f"rows with no pair within max_length={max_length}")
            if max_pairs_per_prompt is not None and len(keep) > max_pairs_per_prompt:
                rng = np.random.default_rng([util.seed % 2**32, zlib.crc32(str(id_).encode())])
                keep = sorted(rng.choice(keep, max_pairs_per_prompt, replace=False).tolist())
            return paired_sample(
                id_,
                [pairs[j] for j in keep],
                None if margins is None else [margins[j] for j in keep],
                meta,
            )

        rows = owned_rows("rw_paired", util, dataset_path, dataset_builder, split, id_key)
        super().__init__("rw_paired", util, rows, metadata_keys, build, tok, texts)


register_dataset("rw_paired", RewardPairDataset)
