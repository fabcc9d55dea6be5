"""Shared plumbing of the registered datasets: read rows, keep this rank's shard, build one
``SequenceSample`` per row, count and report every row or pair left out (never silently);
``RowDataset``, the base of the datasets read from a file, a list or a builder's rows."""

from __future__ import annotations

import collections
import contextlib
import gc
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

import torch

from realrl.api.core.data_api import DatasetUtility, SequenceSample
from realrl.base import logging
from realrl.impl.dataset.errors import DataError, get_field
from realrl.impl.dataset.sharding import shard_indices
from realrl.impl.dataset.sources import DataSource, RowTable, load_rows
from realrl.impl.dataset.tokenize import BATCH_ROWS, BatchTokenizer

logger = logging.getLogger("dataset")


class Skip(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a row builder to leave a row out; the message is the reason that gets counted."""


# builder(row, where, id, metadata, dropped) -> SequenceSample; raises Skip to leave the row out
RowBuilder = Callable[[dict[str, Any], str, Hashable, dict[str, Any], collections.Counter], SequenceSample]
# texts(row) -> the (text, add_special_tokens) the builder will tokenize for that row: a hint only
RowTexts = Callable[[dict[str, Any]], Iterable[tuple[str, bool]]]


def owned_rows(
    name: str,
    util: DatasetUtility,
    dataset_path: DataSource | None,
    dataset_builder: Callable[[], Any] | None,
    split: str | None,
    id_key: str | None,
) -> list[tuple[dict[str, Any], str, Hashable]]:
    """(row, where, id) of the rows this rank owns. The id is the row index, or the row's own
    ``id_key`` field: stable whatever the number of ranks."""
    if (dataset_path is None) == (dataset_builder is None):
        raise ValueError(f"{name}: give exactly one of dataset_path and dataset_builder")
    table = load_rows(dataset_path if dataset_path is not None else dataset_builder, split)
    ids = _row_ids(table, id_key)
    owned = shard_indices(len(table), util.dp_rank, util.world_size, util.seed)
    return [(table.rows[i], table.where(i), ids[i]) for i in owned]


def _row_ids(table: RowTable, id_key: str | None) -> list[Hashable]:
    if id_key is None:
        return list(range(len(table)))
    ids = [get_field(r, id_key, (str, int), table.where(i)) for i, r in enumerate(table.rows)]
    seen: dict[Hashable, int] = {}
    for i, x in enumerate(ids):
        if x in seen:
            raise DataError(f"{table.where(i)}: field {id_key!r} repeats id {x!r} of {table.where(seen[x])}")
        seen[x] = i
    return ids


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Building a dataset allocates ~10 containers per row, all kept and none of them cyclic
    garbage; the cyclic collector would re-scan them over and over (a quarter to a third of the
    load time). Reference counting still frees everything temporary; the collector is restored
    (if it was on) however the build ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _chunk_texts(
    chunk: Sequence[tuple[dict[str, Any], str, Hashable]], texts: RowTexts
) -> Iterator[tuple[str, bool]]:
    for row, _, _ in chunk:
        try:
            yield from texts(row)
        except Exception:  # noqa: BLE001 - a row the hint cannot read is left to its builder,
            continue  # which raises the same error as ever, in row order (or skips the row)


class SampleListDataset(torch.utils.data.Dataset):
    """A dataset of ready one-sample ``SequenceSample`` items for this data-parallel rank.

    ``dropped`` counts what was left out, by reason (rows, or single pairs of a multi-pair row);
    ``n_rows`` is the number of source rows this rank owned before filtering.
    """

    def __init__(
        self,
        name: str,
        util: DatasetUtility,
        rows: Sequence[tuple[dict[str, Any], str, Hashable]],
        metadata_keys: Sequence[str],
        build: RowBuilder,
        tok: BatchTokenizer | None = None,
        texts: RowTexts | None = None,
    ):
        """``tok`` and ``texts``: tokenize the texts of each chunk of rows in one batch call before
        the chunk is built; ``build`` then reads them from ``tok`` (the same ids, much faster)."""
        self.util = util
        self.n_rows = len(rows)
        self.dropped: collections.Counter[str] = collections.Counter()
        self.samples: list[SequenceSample] = []
        with _cyclic_gc_paused():
            for start in range(0, len(rows), BATCH_ROWS):
                chunk = rows[start : start + BATCH_ROWS]
                if tok is not None and texts is not None:
                    tok.prefetch(_chunk_texts(chunk, texts))
                for row, where, id_ in chunk:
                    meta = {k: get_field(row, k, object, where) for k in metadata_keys}
                    try:
                        self.samples.append(build(row, where, id_, meta, self.dropped))
                    except Skip as s:
                        self.dropped[str(s)] += 1
        if self.dropped:
            logger.warning(
                "%s (rank %d/%d): kept %d of %d rows; left out: %s",
                name,
                util.dp_rank,
                util.world_size,
                len(self.samples),
                self.n_rows,
                dict(self.dropped),
            )
        else:
            logger.info("%s (rank %d/%d): %d samples", name, util.dp_rank, util.world_size, len(self.samples))
        if not self.samples and self.n_rows:
            raise DataError(
                f"{rows[0][1]}: {name}: every row of rank {util.dp_rank} was left out, this one first: "
                f"{dict(self.dropped)}"
            )

    @property
    def n_filtered(self) -> int:
        """Rows and pairs left out, all reasons together."""
        return sum(self.dropped.values())

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> SequenceSample:
        return self.samples[idx]


class RowDataset(SampleListDataset):
    """A registered dataset of rows from ``dataset_path`` or ``dataset_builder`` (``split`` of a
    dataset with splits), this rank's shard of them, tokenized with the run's tokenizer (``tok``).

    A subclass names itself (``dataset_name``, in its logs and errors), keeps its own options
    before calling this constructor, and makes each row's sample in ``build_row`` (a ``RowBuilder``,
    raising ``Skip`` to leave the row out); ``row_texts`` lists the texts of a row to tokenize ahead
    in one batch call (a ``RowTexts`` hint). ``id_key`` and ``metadata_keys``: see ``owned_rows``
    and ``SampleListDataset``.
    """

    dataset_name: str

    def __init__(
        self,
        util: DatasetUtility,
        dataset_path: DataSource | None,
        dataset_builder: Callable[[], Any] | None,
        split: str | None,
        id_key: str | None,
        metadata_keys: Sequence[str],
    ):
        self.tok = BatchTokenizer(util.tokenizer)
        rows = owned_rows(self.dataset_name, util, dataset_path, dataset_builder, split, id_key)
        super().__init__(
            self.dataset_name, util, rows, metadata_keys, self.build_row, self.tok, self.row_texts
        )

    def row_texts(self, row: dict[str, Any]) -> Iterable[tuple[str, bool]]:
        raise NotImplementedError

    def build_row(
        self,
        row: dict[str, Any],
        where: str,
        id_: Hashable,
        meta: dict[str, Any],
        dropped: collections.Counter,
    ) -> SequenceSample:
        raise NotImplementedError
