"""Errors that are the user's to fix, and how the command lines show them.

A configuration or input error (an unknown key, a wrong type, a value outside its choices, a
missing file, a malformed data row) is one line naming the key, or the file and line, and what
was expected, and exit status 2 (the status of a usage error in POSIX utilities), with no
traceback: the traceback would point into realrl, not at what to change. ``debug=true`` on the
command line, or ``HYDRA_FULL_ERROR=1`` in the environment (hydra's switch, kept for habit), shows
the traceback as well (``realrl.apps.overrides.wants_traceback``). Anything else (a worker crash, a bug) keeps its full message and exits 1.
"""

from __future__ import annotations

import re

EXIT_FAILED = 1
EXIT_USER_ERROR = 2

# the exception types a DataError has in a worker's formatted traceback
_DATA_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?DataError: ", re.MULTILINE)
# omegaconf appends where an error happened on lines of their own; the key is named already
_OMEGACONF_DETAIL = re.compile(r"^\s*(full_key|reference_type|object_type)[:=]")


class UserError(ValueError):
    """A configuration or input error; its message is one line that says what to change."""


def one_line(message: str) -> str:
    """``message`` without omegaconf's detail lines, its lines joined by spaces."""
    lines = [ln.strip() for ln in str(message).splitlines() if not _OMEGACONF_DETAIL.match(ln)]
    return " ".join(ln for ln in lines if ln)


def data_error_message(exc: BaseException) -> str | None:
    """The message of a dataset ``DataError`` behind ``exc``: raised in this process, or in a
    worker (then only its formatted traceback crosses over, in ``WorkerError.remote_traceback``).
    None when ``exc`` has none (a crash, a bug)."""
    from realrl.impl.dataset.errors import DataError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DataError):
            return one_line(str(exc))
        remote = getattr(exc, "remote_traceback", None)
        if isinstance(remote, str):
            # the last exception of the chain is what the worker raised
            found = list(_DATA_ERROR_LINE.finditer(remote))
            if found and _is_last_exception(remote, found[-1].start()):
                return one_line(remote[found[-1].end() :])
        exc = exc.__cause__ or exc.__context__
    return None


def _is_last_exception(text: str, start: int) -> bool:
    """Nothing but the message follows the exception line at ``start`` (no further traceback)."""
    return "Traceback (most recent call last)" not in text[start:]
