"""Telling a whole checkpoint from a damaged one, and replacing folders without a half state.

A run that loads a cut or overwritten file should stop with an error naming that file instead
of a library's message about "invalid header" (or, worse, silently loading garbage). These
checks read only what the formats make cheap to check:

* ``*.safetensors``: the 8-byte header length, the JSON header, and that the data the header
  describes ends exactly at the end of the file (a cut file is always caught; a flipped bit
  inside tensor data is not: the format has no checksum);
* ``*.pt`` / ``*.bin`` zip archives (``torch.save``): the central directory and, with
  ``crc=True``, every member's CRC-32 (a full read);
* ``*.json``: that it parses.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import struct
import zipfile

ZIP_MAGIC = b"PK\x03\x04"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
CRITIC_HEAD = "critic_head.safetensors"  # nn/hf_io.py's name for a critic's scalar head


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read back; the message names the file (and, where
    the caller knows them, the role and the step)."""


def _check_safetensors(path: str, size: int) -> None:
    if size < 8:
        raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors file (cut short?)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise CheckpointError(
                f"{path}: its header claims {n} bytes but the file holds {size - 8} after the length "
                "(cut short or overwritten)"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: unreadable safetensors header (not a JSON object)")
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    expected = 8 + n + max(ends, default=0)
    if expected != size:
        raise CheckpointError(
            f"{path}: {size} bytes but its header describes {expected} (cut short or overwritten)"
        )


def _check_zip(path: str, crc: bool) -> None:
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip() if crc else None
    except Exception as e:  # noqa: BLE001 - zipfile meets damage with many exception types
        raise CheckpointError(
            f"{path}: not a readable torch archive ({type(e).__name__}: {e}; cut short or overwritten)"
        ) from None
    if bad is not None:
        raise CheckpointError(f"{path}: member {bad!r} fails its CRC-32 check (corrupted)")


def check_file(path: str, crc: bool = True) -> None:
    """Raise ``CheckpointError`` naming ``path`` when it is missing or visibly damaged (see the
    module docstring); files of other formats only need to exist."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing")
    size = os.path.getsize(path)
    name = os.path.basename(path)
    if name.endswith(".safetensors"):
        _check_safetensors(path, size)
    elif name.endswith((".pt", ".bin")):
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == ZIP_MAGIC:
            _check_zip(path, crc)
        elif name.endswith(".pt"):  # torch.save writes zip archives; a legacy *.bin may be a pickle
            raise CheckpointError(f"{path}: not a torch archive (starts with {magic!r}; overwritten?)")
    elif name.endswith(".json"):
        try:
            with open(path) as f:
                json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def hf_weight_files(path: str) -> list[str]:
    """The weight files a Hugging Face checkpoint folder needs: those its safetensors index
    names, else every ``*.safetensors`` (else ``*.bin``) file, plus a critic's head file."""
    index = os.path.join(path, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        check_file(index)
        with open(index) as f:
            names = sorted(set(json.load(f).get("weight_map", {}).values()))
        files = [os.path.join(path, n) for n in names]
    else:
        safe = [f for f in glob.glob(os.path.join(path, "*.safetensors")) if not f.endswith(CRITIC_HEAD)]
        files = sorted(safe) or sorted(glob.glob(os.path.join(path, "*.bin")))
    with open(os.path.join(path, CONFIG)) as f:
        head = json.load(f).get("realrl_critic")
    if isinstance(head, dict):
        files.append(os.path.join(path, head.get("head_file", CRITIC_HEAD)))
    return sorted(set(files))


def verify_hf_checkpoint(path: str, what: str) -> None:
    """Raise ``CheckpointError`` naming ``what`` (e.g. "model 'actor'") and the file when the HF
    checkpoint folder ``path`` is missing, has no config or weights, or a file is damaged."""
    try:
        if not os.path.isdir(path):
            raise CheckpointError(f"{path}: no such checkpoint folder")
        check_file(os.path.join(path, CONFIG))
        files = hf_weight_files(path)
        if not files:
            raise CheckpointError(f"{path}: no *.safetensors or *.bin weights")
        for file in files:
            check_file(file, crc=False)  # a full CRC pass would read big *.bin files twice
    except CheckpointError as e:
        raise CheckpointError(f"{what}: damaged Hugging Face checkpoint: {e}") from None


def write_json_atomic(path: str, value) -> None:
    """Write JSON to ``path`` through a temporary file, flushed to disk, then renamed: readers
    see the old content or the new, never a cut one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_path(path: str) -> None:
    """Remove a file, link or folder left at ``path`` (nothing there is fine)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def replace_dir(tmp: str, final: str) -> None:
    """Put the finished folder ``tmp`` under the name ``final`` with renames only. If the second
    rename fails the previous folder is renamed back, so ``final`` is never left missing."""
    if not os.path.exists(final):
        os.rename(tmp, final)
        return
    old = final + ".old"
    remove_path(old)
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)
        raise
    remove_path(old)
