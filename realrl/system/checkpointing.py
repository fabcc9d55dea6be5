"""Checkpoints the runtime writes: HF-format models for users, recover points for resuming.

Layout under the run folder:
  checkpoints/<role>/step<k>/, checkpoints/<role>/final/   ``interface.save``: HF weights + tokenizer
  recover/step<k>/<role>/                                  a trained role: ``engine.save`` (weights,
                                                           optimizer, schedule, RNG, and as extra
                                                           state the model version + interface states)
  recover/step<k>/<role>/<mfc>.rank<r>.state.pt            a frozen role's stateful interface (e.g.
                                                           the reward normalisation fitted on the
                                                           first PPO batch), one file per rank
  recover/step<k>/inflight/<mfc>.step<j>.json             asynchronous RL: a generate call of a step
  recover/step<k>/inflight/<mfc>.step<j>.part<r>.pt        after k that sampled from weights older
                                                           than the point's (its record; the answers
                                                           of each data-parallel part)
  recover/step<k>/master.json                              the master's counters (the data feed's
                                                           position along the dataset)
  recover/step<k>/manifest.json                            every file of the point with its size:
                                                           written once every part is on disk, so
                                                           its presence marks the point complete
  recover/latest.json                                      {"step": k}: the newest complete point

Only the two newest complete points are kept: the previous one stays until a newer one is
complete, and a resumed run takes the newest point that passes ``verify_recover_point`` (named
problems are logged for the ones it skips).

A worker's data order is a function of (seed, epoch, dp rank); the master's position along it
(batches fetched: one per step, more with dynamic sampling) is kept in ``master.json``. RNG needs
no saving: every call reseeds.

This module is the master's half (where points live, which are complete, which to resume from)
and imports no torch; the workers write and read their parts with ``recover_state``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

from realrl.impl.model.backend.integrity import (
    CheckpointError,
    check_file,
    remove_path,
    write_json_atomic,
)

LATEST = "latest.json"
MANIFEST = "manifest.json"
KEEP_COMPLETE = 2  # complete recover points kept on disk: the newest and a fallback
_STEP_DIR = re.compile(r"^step(\d+)$")


class RecoverPointError(CheckpointError):
    """A recover point (or one file of it) that cannot be written or read back."""

    def __init__(self, message: str, step: int | None = None, role: str | None = None):
        where = ", ".join(
            p for p in (f"step {step}" if step is not None else "", f"role {role!r}" if role else "") if p
        )
        super().__init__(f"recover point ({where}): {message}" if where else f"recover point: {message}")
        self.step, self.role = step, role


def hf_dir(run_dir: str, role: str, step: int | None) -> str:
    return os.path.join(run_dir, "checkpoints", role, "final" if step is None else f"step{step}")


def recover_root(run_dir: str) -> str:
    return os.path.join(run_dir, "recover")


def step_dir(run_dir: str, step: int) -> str:
    return os.path.join(recover_root(run_dir), f"step{step}")


def recover_dir(run_dir: str, step: int, role: str) -> str:
    return os.path.join(step_dir(run_dir, step), role)


def state_file(run_dir: str, step: int, role: str, mfc: str, rank: int) -> str:
    """Where rank ``rank`` of the call ``mfc`` keeps its interface state (a frozen role)."""
    return os.path.join(recover_dir(run_dir, step, role), f"{mfc}.rank{rank}.state.pt")


def inflight_dir(run_dir: str, step: int) -> str:
    return os.path.join(step_dir(run_dir, step), "inflight")


def inflight_record(run_dir: str, step: int, mfc: str, call_step: int) -> str:
    """Where the master keeps what one in-flight generate call of the point of ``step`` reported."""
    return os.path.join(inflight_dir(run_dir, step), f"{mfc}.step{call_step}.json")


def inflight_part(run_dir: str, step: int, mfc: str, call_step: int, part: int) -> str:
    """Where data-parallel part ``part`` of that call's answers is saved (by the part's first worker)."""
    return os.path.join(inflight_dir(run_dir, step), f"{mfc}.step{call_step}.part{part}.pt")


def master_state_file(run_dir: str, step: int) -> str:
    return os.path.join(step_dir(run_dir, step), "master.json")


def read_master_state(run_dir: str, step: int) -> dict:
    """The master's counters the point of ``step`` kept ({} for a point written without them)."""
    path = master_state_file(run_dir, step)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def read_inflight(run_dir: str, step: int) -> dict[tuple[str, int], dict]:
    """(mfc, call step) -> record of every in-flight generate call the point of ``step`` holds."""
    folder = inflight_dir(run_dir, step)
    out = {}
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json"):
                with open(os.path.join(folder, name)) as f:
                    record = json.load(f)
                out[(record["mfc"], int(record["step"]))] = record
    return out


# -- which points exist --------------------------------------------------------------------------


def step_dirs(run_dir: str) -> list[int]:
    """Steps of every ``recover/step<k>`` folder, complete or not, ascending."""
    root = recover_root(run_dir)
    if not os.path.isdir(root):
        return []
    steps = [_STEP_DIR.match(n) for n in os.listdir(root)]
    return sorted(int(m.group(1)) for m in steps if m and os.path.isdir(os.path.join(root, m.group(0))))


def complete_steps(run_dir: str) -> list[int]:
    """Steps of the recover points marked complete (holding a manifest), ascending."""
    return [s for s in step_dirs(run_dir) if os.path.isfile(os.path.join(step_dir(run_dir, s), MANIFEST))]


def read_latest(run_dir: str) -> int | None:
    """The step ``latest.json`` names, None without one; a damaged one raises, naming it."""
    path = os.path.join(recover_root(run_dir), LATEST)
    try:
        with open(path) as f:
            return int(json.load(f)["step"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise RecoverPointError(f"{path} is damaged ({type(e).__name__}: {e})") from None


# -- marking -------------------------------------------------------------------------------------


def _leftover(name: str) -> bool:
    """A temporary or replaced file or folder of an interrupted write (never part of a point)."""
    return name.endswith((".tmp", ".old"))


def _files(folder: str) -> dict[str, int]:
    out = {}
    for parent, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not _leftover(d)]
        for name in names:
            path = os.path.join(parent, name)
            rel = os.path.relpath(path, folder)
            if rel != MANIFEST and not _leftover(name):
                out[rel] = os.path.getsize(path)
    return dict(sorted(out.items()))


def mark_recover_point(run_dir: str, step: int) -> None:
    """Publish ``step`` (every part saved) as complete: its manifest, then ``latest.json``, both
    atomic; then drop the points older than the newest ``KEEP_COMPLETE`` complete ones (never a
    newer folder: it may be one being written)."""
    folder = step_dir(run_dir, step)
    try:
        write_json_atomic(os.path.join(folder, MANIFEST), {"step": step, "files": _files(folder)})
        write_json_atomic(os.path.join(recover_root(run_dir), LATEST), {"step": step})
    except OSError as e:
        raise RecoverPointError(
            f"cannot mark {folder} complete ({type(e).__name__}: {e}); the previous recover point is "
            "unchanged",
            step,
        ) from e
    kept = [s for s in complete_steps(run_dir) if s <= step][-KEEP_COMPLETE:]
    for s in step_dirs(run_dir):
        if s < kept[0]:
            remove_path(step_dir(run_dir, s))


def discard_after(run_dir: str, step: int) -> list[int]:
    """Remove the recover points newer than ``step`` (unmarked or unreadable ones a resumed run
    will write again), so none of their files can mix with the new ones; return their steps."""
    newer = [s for s in step_dirs(run_dir) if s > step]
    for s in newer:
        remove_path(step_dir(run_dir, s))
    return newer


# -- verifying and choosing ----------------------------------------------------------------------


def _role_of(rel: str) -> str | None:
    parts = rel.split(os.sep)
    return parts[0] if len(parts) > 1 else None


def verify_recover_point(run_dir: str, step: int) -> None:
    """Raise ``RecoverPointError`` naming the step, the role and the file when the point is not
    complete (no manifest), a file is missing or has another size than when it was marked, or
    a file is damaged (``integrity.check_file``, CRCs included)."""
    folder = step_dir(run_dir, step)
    manifest = os.path.join(folder, MANIFEST)
    if not os.path.isfile(manifest):
        raise RecoverPointError(f"{folder} was never marked complete (no {MANIFEST})", step)
    try:
        with open(manifest) as f:
            files = dict(json.load(f)["files"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise RecoverPointError(f"{manifest} is damaged ({type(e).__name__}: {e})", step) from None
    for rel, size in files.items():
        path = os.path.join(folder, rel)
        role = _role_of(rel)
        if not os.path.isfile(path):
            raise RecoverPointError(f"{path} is missing", step, role)
        actual = os.path.getsize(path)
        if actual != size:
            raise RecoverPointError(f"{path} holds {actual} bytes, {size} when it was saved", step, role)
        try:
            check_file(path)
        except CheckpointError as e:
            raise RecoverPointError(str(e), step, role) from None


def require_parts(run_dir: str, step: int, roles: list[str], state_files: list[str]) -> None:
    """Raise ``RecoverPointError`` when the point lacks a role or a state file this run needs
    (e.g. it was written by a run with other models)."""
    for role in roles:
        if not os.path.isdir(recover_dir(run_dir, step, role)):
            raise RecoverPointError(f"no {recover_dir(run_dir, step, role)} for this run's model", step, role)
    for path in state_files:
        if not os.path.isfile(path):
            role = os.path.basename(os.path.dirname(path))
            raise RecoverPointError(f"{path} is missing (a state this run needs)", step, role)


@dataclasses.dataclass
class RecoverChoice:
    """The recover point a resumed run starts from (None: from step 0) and why newer ones were
    skipped."""

    step: int | None
    skipped: list[str] = dataclasses.field(default_factory=list)


def choose_recover_point(run_dir: str, check=None) -> RecoverChoice:
    """The newest complete point that verifies (and passes ``check(step)``, which raises
    ``RecoverPointError`` for a point the run cannot use). A damaged ``latest.json`` is skipped
    too: the manifests say which points are complete. Raise ``RecoverPointError`` listing every
    problem when complete points exist but none is usable, rather than silently starting over;
    with none ever marked complete, start from step 0."""
    skipped = []
    try:
        latest = read_latest(run_dir)
    except RecoverPointError as e:
        skipped.append(str(e))
        latest = None
    candidates = sorted(set(complete_steps(run_dir)) | ({latest} if latest is not None else set()))
    for step in reversed(candidates):
        try:
            verify_recover_point(run_dir, step)
            if check is not None:
                check(step)
        except RecoverPointError as e:
            skipped.append(str(e))
            continue
        return RecoverChoice(step, skipped)
    if skipped:
        raise RecoverPointError(
            f"no usable recover point under {recover_root(run_dir)}: {'; '.join(skipped)}"
        )
    return RecoverChoice(None)  # never marked one: a run killed before its first point starts over
