"""Reading rows from local JSON, JSONL and Parquet files, ``datasets`` objects and ``save_to_disk``
folders, remembering where each row came from so errors can name the file and line or row."""

from __future__ import annotations

import bisect
import codecs
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from realrl.impl.dataset.errors import DataError

DATA_SUFFIXES = (".json", ".jsonl", ".parquet")  # besides folders written by datasets' save_to_disk


@dataclasses.dataclass
class _Segment:
    start: int  # first global row index of this segment
    label: str  # file path or dataset description
    unit: str  # "line" (JSONL) or "row"
    numbers: list[int] | None = None  # 1-based line numbers of JSONL rows


@dataclasses.dataclass
class RowTable:
    """Rows (dicts) in source order; ``where(i)`` names the file and line or row of row ``i``."""

    rows: list[dict[str, Any]]
    segments: list[_Segment]

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, i: int) -> str:
        seg = self.segments[bisect.bisect_right([s.start for s in self.segments], i) - 1]
        local = i - seg.start
        if seg.numbers is not None:
            return f"{seg.label}: line {seg.numbers[local]}"
        return f"{seg.label}: row {local}"


def _check_objects(rows: list[Any], seg: _Segment) -> None:
    for j, r in enumerate(rows):
        if not isinstance(r, dict):
            n = seg.numbers[j] if seg.numbers is not None else j
            raise DataError(f"{seg.label}: {seg.unit} {n}: expected a JSON object, got {type(r).__name__}")


def _decode(raw: bytes, path: str, line: int) -> str:
    """UTF-8 text; bytes that are not UTF-8 are an error naming the line and column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        line += raw.count(b"\n", 0, e.start)
        raise DataError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {column}); "
            "save the file as UTF-8"
        ) from None


def _brief(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def _read_jsonl(path: str) -> tuple[list[dict], list[int]]:
    """One JSON value per line; blank lines are skipped, a UTF-8 BOM (what some Windows editors
    write first) is dropped, as ``utf-8-sig`` does."""
    rows, numbers = [], []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            line = _decode(raw[3:] if n == 1 and raw.startswith(codecs.BOM_UTF8) else raw, path, n)
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {n}: malformed JSON ({e.msg} at column {e.colno})") from e
            except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, deep nesting
                raise DataError(f"{path}: line {n}: cannot read the JSON ({_brief(e)})") from e
            numbers.append(n)
    return rows, numbers


def _read_json(path: str) -> tuple[list[dict], list[int] | None]:
    with open(path, "rb") as f:
        raw = f.read()
    text = _decode(raw[3:] if raw.startswith(codecs.BOM_UTF8) else raw, path, 1)
    if not text.strip():
        raise DataError(f"{path}: empty file (no rows)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # several top-level values: JSON lines in a .json file
            return _read_jsonl(path)
        raise DataError(f"{path}: line {e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from e
    except (ValueError, RecursionError) as e:
        raise DataError(f"{path}: cannot read the JSON ({_brief(e)})") from e
    if isinstance(data, dict):
        return [data], None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    return data, None


def _read_parquet(path: str) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a bad file
        raise DataError(f"{path}: cannot read as Parquet: {e}") from e


def _hf_rows(ds: Any, label: str, split: str | None) -> list[dict]:
    import datasets

    if isinstance(ds, datasets.DatasetDict):
        split = split or "train"
        if split not in ds:
            raise DataError(f"{label}: no split {split!r} (splits: {sorted(ds)})")
        ds = ds[split]
    if not isinstance(ds, datasets.Dataset):
        raise DataError(f"{label}: expected a datasets.Dataset or DatasetDict, got {type(ds).__name__}")
    return ds.to_list()


def _read_path(path: str, split: str | None) -> tuple[list[dict], _Segment]:
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file or folder")
    if os.path.isdir(path):
        import datasets

        try:
            ds = datasets.load_from_disk(path)
        except (FileNotFoundError, ValueError) as e:
            raise DataError(f"{path}: not a folder written by datasets' save_to_disk: {e}") from e
        return _hf_rows(ds, path, split), _Segment(0, path, "row")
    ext = os.path.splitext(path)[1].lower()
    if ext not in DATA_SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type {ext!r} (use .json, .jsonl, .parquet or a save_to_disk folder)"
        )
    if ext == ".jsonl":
        rows, numbers = _read_jsonl(path)
        return rows, _Segment(0, path, "line", numbers)
    if ext == ".json":
        rows, numbers = _read_json(path)
        return rows, _Segment(0, path, "line" if numbers else "row", numbers)
    return _read_parquet(path), _Segment(0, path, "row")


def _plain(x: Any) -> Any:
    """Config containers (hydra's DictConfig / ListConfig) -> plain dicts and lists."""
    if isinstance(x, Mapping) and not isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes, list)):
        return [_plain(v) for v in x]
    return x


# a path, a list of paths, a datasets object, a list of dicts, or a callable returning one of these
DataSource = Any


def load_rows(source: DataSource, split: str | None = None) -> RowTable:
    """Rows from a path (or list of paths), a ``datasets`` object, a list of dicts or a callable
    returning any of those. An empty source is an error: training on nothing is never intended."""
    if callable(source) and not hasattr(source, "to_list"):
        source = source()
    parts: list[tuple[list[dict], _Segment]] = []
    is_list = isinstance(source, Sequence) and not isinstance(source, (str, bytes))  # also hydra's ListConfig
    if isinstance(source, (str, os.PathLike)):
        parts.append(_read_path(os.fspath(source), split))
    elif is_list and source and all(isinstance(s, (str, os.PathLike)) for s in source):
        parts.extend(_read_path(os.fspath(p), split) for p in source)
    elif is_list:
        parts.append(([_plain(r) for r in source], _Segment(0, "<list of rows>", "row")))
    else:
        parts.append((_hf_rows(source, f"<{type(source).__name__}>", split), _Segment(0, "<dataset>", "row")))
    rows, segments = [], []
    for part_rows, seg in parts:
        if not part_rows:
            raise DataError(f"{seg.label}: empty (no rows)")
        _check_objects(part_rows, seg)
        seg.start = len(rows)
        segments.append(seg)
        rows.extend(part_rows)
    return RowTable(rows, segments)
