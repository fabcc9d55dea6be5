"""Folders and files of a run that no other user can replace, redirect or read.

A run trusts what it reads back from its folder (name_resolve addresses, its worker configs), so
that folder must belong to the user running it and be writable by nobody else: a folder another
user created first (under a shared ``/tmp``, say) could hold symlinks or planted files. Files are
created owner-only with ``O_EXCL | O_NOFOLLOW``: never through a link, never into a file that
was already there.
"""

from __future__ import annotations

import os
import stat


class UnsafePathError(PermissionError):
    """A folder or file of the run that another user owns or may write."""


def unsafe_reason(st: os.stat_result, uid: int, gid: int) -> str | None:
    """Why a folder or file with status ``st`` is not safe for user ``uid`` (primary group
    ``gid``) to trust; None if it is. Writable by the user's own primary group is allowed (a
    umask of 002 with one group per user makes every folder so)."""
    if st.st_uid != uid:
        return f"it belongs to uid {st.st_uid}, not to this user (uid {uid})"
    if st.st_mode & stat.S_IWOTH:
        return f"every user may write it (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_mode & stat.S_IWGRP and st.st_gid != gid:
        return f"group {st.st_gid} may write it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_private(path: str, st: os.stat_result | None = None) -> None:
    reason = unsafe_reason(st or os.lstat(path), os.getuid(), os.getgid())
    if reason is not None:
        raise UnsafePathError(f"refusing {path}: {reason}; use a folder of your own")


def make_private_dirs(path: str, top: str) -> None:
    """Create ``path`` (mode 0o700 for each folder created) and check every folder from ``top``
    down to ``path`` belongs to this user and nobody else may write it. ``top`` (the fileroot)
    must be ``path`` or a folder above it; the folders above ``top`` are the user's choice."""
    path, top = os.path.abspath(path), os.path.abspath(top)
    if os.path.commonpath([path, top]) != top:
        raise ValueError(f"{path} is not under {top}")
    os.makedirs(os.path.dirname(top), exist_ok=True)
    parts, rel = [top], os.path.relpath(path, top)
    if rel != ".":
        for name in rel.split(os.sep):
            parts.append(os.path.join(parts[-1], name))
    for d in parts:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        check_private_dir(d)


def check_private_dir(path: str) -> None:
    """``path`` is a folder of this user's that nobody else may write; a symlink to one is fine
    if the link is this user's too (a fileroot on another disk)."""
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid != os.getuid():
        raise UnsafePathError(f"refusing {path}: a symlink of uid {link.st_uid}, not of this user")
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"refusing {path}: not a folder")
    check_private(path, st)


def write_private(path: str, data: bytes) -> None:
    """Write ``data`` to a new owner-only file at ``path``, replacing our own earlier file there
    (a rerun), never following a link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        check_private(path, st)
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def read_private(path: str) -> bytes:
    """The bytes of ``path``, a file of this user's that nobody else may write (one that code
    is built from: a pickle)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        check_private(path, st)
        return f.read()
