"""Each run of a trial folder keeps its own records.

A trial folder (``<fileroot>/<experiment>/<trial>``) holds the records of the run that last
started there at its top: ``stats.jsonl``, ``summary.json``, ``logs/``, ``tensorboard/``, ... A
new run (not ``recover_mode=resume``) started where an earlier one left its records first moves
them, whole, to ``previous/run-<when the earlier run started>/``: its ``stats.jsonl`` and summary
are not replaced, its ``master.log`` not appended to, and TensorBoard, pointed at the fileroot,
shows the two runs as two runs instead of one curve with two step 1s. A resumed run continues its
own records where they are. The earlier run's recover points (``recover/``) go with its records:
they resume that run only, and left in place a later ``recover_mode=resume`` of the new run would
start from a point the new run never reached. Checkpoints (``checkpoints/``) are never moved: they
are what later phases reuse.
"""

from __future__ import annotations

import os
import time

from realrl.apps.errors import UserError
from realrl.base import private_files

# what one run writes for itself; everything else in a trial folder stays where it is
RECORDS = (
    "stats.jsonl",
    "samples.jsonl",
    "summary.json",
    "logs",
    "tensorboard",
    "plots",
    "dataflow_graph.png",
    "experiment_config.json",
    "worker_configs.json",
    "recover",
)
RECOVER = "recover"  # moved only with the records of the run that wrote them
PREVIOUS = "previous"
STARTED = "experiment_config.json"  # written as a run starts: when it began


def earlier_records(run_dir: str) -> list[str]:
    """The names of ``RECORDS`` an earlier run left in ``run_dir``."""
    return [name for name in RECORDS if os.path.lexists(os.path.join(run_dir, name))]


def set_aside(run_dir: str, fileroot: str) -> str | None:
    """Move the records an earlier run left in ``run_dir`` to a new folder under
    ``run_dir/previous/``, named after when that run started; that folder (None: nothing there to
    move). ``UserError`` when the folder is another user's to write (as a run would refuse it)."""
    names = earlier_records(run_dir)
    if not [name for name in names if name != RECOVER]:  # recover points alone are no earlier run's records
        return None
    paths = [os.path.join(run_dir, name) for name in names]
    started = os.path.join(run_dir, STARTED)
    when = os.lstat(started).st_mtime if STARTED in names else min(os.lstat(p).st_mtime for p in paths)
    base = os.path.join(run_dir, PREVIOUS, "run-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(when)))
    target, n = base, 1
    while os.path.lexists(target):  # two runs started in one second
        n += 1
        target = f"{base}-{n}"
    try:
        private_files.make_private_dirs(target, fileroot)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot keep the earlier run's records under {target}: {e}") from e
    for name, path in zip(names, paths, strict=True):
        os.rename(path, os.path.join(target, name))  # same folder tree: nothing copied
    return target
