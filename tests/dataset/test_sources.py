"""Reading rows: JSON, JSONL, Parquet, datasets objects, save_to_disk folders; errors that say where."""

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from realrl.impl.dataset.errors import DataError, get_field
from realrl.impl.dataset.sources import load_rows

ROWS = [{"prompt": "a", "answer": "b"}, {"prompt": "c", "answer": "d"}, {"prompt": "e", "answer": "f"}]


def _write(tmp_path, kind):
    if kind == "json":
        p = tmp_path / "d.json"
        p.write_text(json.dumps(ROWS))
    elif kind == "jsonl":
        p = tmp_path / "d.jsonl"
        p.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    elif kind == "json_lines_in_json":
        p = tmp_path / "d.json"
        p.write_text("\n".join(json.dumps(r) for r in ROWS))
    elif kind == "parquet":
        p = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), p)
    elif kind == "save_to_disk":
        p = tmp_path / "saved"
        datasets.Dataset.from_list(ROWS).save_to_disk(str(p))
    elif kind == "save_to_disk_dict":
        p = tmp_path / "saved_dict"
        datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(p))
    return str(p)


@pytest.mark.parametrize(
    "kind", ["json", "jsonl", "json_lines_in_json", "parquet", "save_to_disk", "save_to_disk_dict"]
)
def test_every_file_kind_gives_the_same_rows(tmp_path, kind):
    table = load_rows(_write(tmp_path, kind))
    assert table.rows == ROWS


def test_in_memory_sources():
    assert load_rows(datasets.Dataset.from_list(ROWS)).rows == ROWS
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:1]), "test": datasets.Dataset.from_list(ROWS[1:])}
    )
    assert load_rows(dd, split="test").rows == ROWS[1:]
    assert load_rows(ROWS).rows == ROWS
    assert load_rows(lambda: ROWS).rows == ROWS
    with pytest.raises(DataError, match="no split 'valid'"):
        load_rows(dd, split="valid")


def test_several_files_concatenate_and_remember_where(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n")
    b = tmp_path / "b.json"
    b.write_text(json.dumps(ROWS[2:]))
    table = load_rows([str(a), str(b)])
    assert table.rows == ROWS
    assert table.where(0) == f"{a}: line 1"
    assert table.where(1) == f"{a}: line 3"  # the blank line counts
    assert table.where(2) == f"{b}: row 0"


def test_malformed_json_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(ROWS[0]) + "\n" + '{"prompt": "x", ' + "\n")
    with pytest.raises(DataError, match=rf"{p}: line 2: malformed JSON"):
        load_rows(str(p))


def test_malformed_json_file_names_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('[\n{"prompt": "x"},\n{"prompt": }\n]')
    with pytest.raises(DataError, match=rf"{p}: line 3: malformed JSON"):
        load_rows(str(p))


@pytest.mark.parametrize(
    "name,content", [("e.jsonl", ""), ("e.json", "  \n"), ("l.json", "[]"), ("b.jsonl", "\n\n")]
)
def test_empty_files_are_errors(tmp_path, name, content):
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(DataError, match=rf"{p}: empty"):
        load_rows(str(p))


def test_empty_dataset_and_non_object_rows(tmp_path):
    with pytest.raises(DataError, match="empty"):
        load_rows(datasets.Dataset.from_dict({"prompt": []}))
    p = tmp_path / "x.jsonl"
    p.write_text('{"prompt": "a"}\n[1, 2]\n')
    with pytest.raises(DataError, match=rf"{p}: line 2: expected a JSON object"):
        load_rows(str(p))


def test_unknown_paths_and_types(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_rows(str(tmp_path / "missing.jsonl"))
    p = tmp_path / "d.csv"
    p.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        load_rows(str(p))
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="save_to_disk"):
        load_rows(str(tmp_path / "folder"))
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(DataError, match=rf"{bad}: cannot read as Parquet"):
        load_rows(str(bad))


def test_get_field_names_the_field():
    where = "f.jsonl: line 7"
    assert get_field({"a": 1}, "a", int, where) == 1
    assert get_field({"m": 2}, "m", float, where) == 2  # an int is a valid number
    with pytest.raises(DataError, match="f.jsonl: line 7: missing field 'b'"):
        get_field({"a": 1}, "b", int, where)
    with pytest.raises(DataError, match="f.jsonl: line 7: field 'a' must be a string, got int"):
        get_field({"a": 1}, "a", str, where)
    with pytest.raises(DataError, match="field 'a' must be a number, got bool"):
        get_field({"a": True}, "a", float, where)


def test_rows_from_a_hydra_config_become_plain_dicts_and_lists():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"rows": [{"chosen_ids": [1, 2], "rejected_ids": [3]}]})
    (row,) = load_rows(cfg.rows).rows
    assert row == {"chosen_ids": [1, 2], "rejected_ids": [3]}
    assert type(row) is dict and type(row["chosen_ids"]) is list
