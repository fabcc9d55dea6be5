"""``PromptRawDataset``: one accessor API over many preference / instruction sources (as in
DeepSpeed-Chat's ``raw_datasets.py``).

Each adapter reads a local copy of its source in that source's own schema (nothing is fetched at
run time) and formats it DeepSpeed-Chat's way: prompt " Human: ... Assistant:", responses " ...".
``get_prompt_and_chosen`` is ``get_prompt + get_chosen`` unless an adapter says otherwise; an
accessor returns None where the source has no such text (e.g. no rejected answers).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from realrl.impl.dataset.dschat.split import phase_indices
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.sources import DataSource, RowTable, load_rows

_EXTS = (".jsonl", ".json", ".parquet")


def _split_files(folder: str) -> dict[str, str]:
    """``{split: file}`` for files named like ``train.jsonl`` or ``test.parquet`` in ``folder``."""
    out = {}
    for name in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(name)
        if ext in _EXTS and stem not in out:
            out[stem] = os.path.join(folder, name)
    return out


def load_local_copy(data_path: DataSource | Mapping[str, DataSource]) -> dict[str, RowTable]:
    """Splits of a local copy: ``{split: source}``, a folder of ``<split>.<ext>`` files, a
    ``save_to_disk`` folder of a DatasetDict, a ``datasets`` object, or one file (= "train")."""
    import datasets

    if isinstance(data_path, Mapping):
        return {k: load_rows(v) for k, v in data_path.items()}
    if isinstance(data_path, datasets.DatasetDict):
        return {k: load_rows(v) for k, v in data_path.items()}
    if isinstance(data_path, (str, os.PathLike)) and os.path.isdir(data_path):
        folder = os.fspath(data_path)
        if os.path.exists(os.path.join(folder, "dataset_dict.json")):
            return {k: load_rows(v) for k, v in datasets.load_from_disk(folder).items()}
        if os.path.exists(os.path.join(folder, "dataset_info.json")):  # one saved Dataset
            return {"train": load_rows(folder)}
        sub = os.path.join(folder, "data")  # DeepSpeed-Chat's local/jsonfile layout
        files = _split_files(folder) or (_split_files(sub) if os.path.isdir(sub) else {})
        if not files:
            raise DataError(f"{folder}: no <split>.jsonl/.json/.parquet files and not a save_to_disk folder")
        return {k: load_rows(v) for k, v in files.items()}
    return {"train": load_rows(data_path)}


class PromptRawDataset(ABC):
    """Base adapter. Subclasses set ``dataset_name``, ``eval_split`` and the accessors.

    ``eval_split = None`` means the source ships only a train split; like DeepSpeed-Chat, its rows
    are then cut 9:1 into train and eval with the seed (``phase_indices(n, "9,1", ...)``).
    """

    dataset_name: str = "?"
    eval_split: str | None = "test"
    has_rejected: bool = True

    def __init__(self, data_path: Any, seed: int = 1234, cache_dir: str | None = None):
        self.seed = seed
        self.cache_dir = cache_dir
        self.splits = load_local_copy(data_path)
        if "train" not in self.splits:
            raise DataError(
                f"{self.dataset_name}: local copy {data_path!r} has no 'train' split ({sorted(self.splits)})"
            )

    @property
    def dataset_name_clean(self) -> str:
        return self.dataset_name.replace("/", "_").replace("-", "_")

    def part_rows(self, part: str) -> list[tuple[dict, str, int]]:
        """(row, where, row index in its split) of the "train" or "eval" part."""
        if part not in ("train", "eval"):
            raise ValueError(f"part must be 'train' or 'eval', got {part!r}")
        if self.eval_split is None:  # train-only source: cut 9:1 as DeepSpeed-Chat does
            t = self.splits["train"]
            idx = phase_indices(len(t), "9,1", 1 if part == "train" else 2, self.seed, self.cache_dir)
        else:
            name = "train" if part == "train" else self.eval_split
            if name not in self.splits:
                raise DataError(
                    f"{self.dataset_name}: local copy has no {name!r} split ({sorted(self.splits)})"
                )
            t = self.splits[name]
            idx = list(range(len(t)))
        return [(t.rows[i], t.where(i), i) for i in idx]

    def get_train_data(self) -> list[dict]:
        return [r for r, _, _ in self.part_rows("train")]

    def get_eval_data(self) -> list[dict]:
        return [r for r, _, _ in self.part_rows("eval")]

    def field(self, sample: Mapping[str, Any], *path: str | int) -> Any:
        """``sample[path[0]][path[1]]...``; a missing or mistyped step is a DataError naming it."""
        value: Any = sample
        for j, key in enumerate(path):
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                where = "".join(f"[{p!r}]" for p in path[: j + 1])
                raise DataError(f"{self.dataset_name}: sample has no field {where}") from None
        return value

    def text(self, sample: Mapping[str, Any], *path: str | int) -> str | None:
        """A text field (None stays None: the source lacks that text for this row)."""
        value = self.field(sample, *path)
        if value is not None and not isinstance(value, str):
            where = "".join(f"[{p!r}]" for p in path)
            raise DataError(f"{self.dataset_name}: field {where} must be text, got {type(value).__name__}")
        return value

    @abstractmethod
    def get_prompt(self, sample: Mapping[str, Any]) -> str | None:
        """The prompt text of one row in the source's schema."""

    @abstractmethod
    def get_chosen(self, sample: Mapping[str, Any]) -> str | None:
        """The preferred (or only) answer text of one row."""

    def get_rejected(self, sample: Mapping[str, Any]) -> str | None:
        return None

    def get_prompt_and_chosen(self, sample: Mapping[str, Any]) -> str | None:
        p, c = self.get_prompt(sample), self.get_chosen(sample)
        return None if p is None or c is None else p + c

    def get_prompt_and_rejected(self, sample: Mapping[str, Any]) -> str | None:
        p, r = self.get_prompt(sample), self.get_rejected(sample)
        return None if p is None or r is None else p + r


def human(prompt: str | None) -> str | None:
    """DeepSpeed-Chat's prompt format."""
    return None if prompt is None else " Human: " + prompt + " Assistant:"


def reply(text: str | None) -> str | None:
    """DeepSpeed-Chat's response format."""
    return None if text is None else " " + text
