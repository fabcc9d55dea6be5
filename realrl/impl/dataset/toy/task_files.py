"""The files of an embedded verifiable task, written once per config: a tokenizer folder, the
supervised and RL rows (train and held-out), and a manifest whose fingerprint says which config
made them. The folder is built aside and moved into place, so a half-written one is never used."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

SPLITS = ("sft_train", "sft_valid", "rl_train", "rl_valid")


@dataclasses.dataclass
class TaskFiles:
    """What a task writes: rows per split, its tokenizer, and facts for the manifest."""

    rows: dict[str, list[dict]]
    save_tokenizer: Callable[[str], Any]
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)


def task_paths(out_dir: str) -> dict[str, str]:
    """Where ``build_once`` puts each file."""
    return {
        "tokenizer": os.path.join(out_dir, "tokenizer"),
        **{name: os.path.join(out_dir, f"{name}.jsonl") for name in SPLITS},
        "manifest": os.path.join(out_dir, "manifest.json"),
    }


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def build_once(out_dir: str, cfg: Any, make: Callable[[], TaskFiles]) -> dict[str, str]:
    """``task_paths(out_dir)``, written by ``make()`` unless a manifest there already carries
    ``cfg.fingerprint()``."""
    paths = task_paths(out_dir)
    if os.path.exists(paths["manifest"]):
        with open(paths["manifest"]) as f:
            if json.load(f).get("fingerprint") == cfg.fingerprint():
                return paths
    tmp_dir = out_dir.rstrip("/") + ".building"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    tmp_paths = task_paths(tmp_dir)
    files = make()
    for name in SPLITS:
        write_jsonl(tmp_paths[name], files.rows[name])
    files.save_tokenizer(tmp_paths["tokenizer"])
    manifest = {
        "fingerprint": cfg.fingerprint(),
        "config": dataclasses.asdict(cfg),
        "counts": {name: len(files.rows[name]) for name in SPLITS},
        **files.facts,
    }
    with open(tmp_paths["manifest"], "w") as f:
        json.dump(manifest, f, indent=2)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)
    return paths
