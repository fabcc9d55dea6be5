"""Compile the C sources of this folder into shared libraries on first use, cached on disk, and
load them with their ctypes prototypes (``library``).

Why not a torch C++ extension: those take a minute to build against torch's headers; a plain C
file with a C ABI builds in under a second with the system compiler and is called through
ctypes. Where no compiler works, ``load`` returns None and ``dispatch.choose_kernel`` keeps every
op on its torch code.

The cache key holds the source, the flags, the compiler's version and the CPU's model and
feature flags, so a library built with ``-march=native`` is never loaded on another kind of
CPU (e.g. a home directory shared over NFS by a heterogeneous cluster). Builds go to a temporary
file renamed into place, so processes that build at once never load a half-written library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

from realrl.base import logging

logger = logging.getLogger("native_kernels")

CACHE_ENV = "REALRL_NATIVE_CACHE"  # where built libraries go (default ~/.cache/realrl/native)
DISABLE_ENV = "REALRL_NO_NATIVE"  # set to 1: never build or load native code
FLAG_SETS = (
    ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno"],
    ["-O3", "-fopenmp-simd", "-fno-math-errno"],  # compilers without -march=native
)


def cache_dir() -> str:
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "realrl", "native")


def compiler() -> str | None:
    """``$CC``, else cc / gcc / clang on the PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def _cpu_signature() -> str:
    """What decides which instructions ``-march=native`` may emit."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _build(cc: str, source: str, flags: list[str], target: str) -> str | None:
    """Compile ``source`` into ``target``; None on success, else the compiler's complaint."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    try:
        cmd = [cc, *flags, "-shared", "-fPIC", source, "-o", tmp, "-lm"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            return (out.stderr or out.stdout).strip()[-2000:]
        os.replace(tmp, target)
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(source: str) -> ctypes.CDLL | None:
    """The shared library built from the C file ``source`` (built now if not cached), or None where
    native code is disabled or no compiler builds it (logged once per process and source)."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None
    cc = compiler()
    if cc is None:
        logger.info("no C compiler found (cc, gcc, clang or $CC): %s stays on its torch fallback", source)
        return None
    with open(source, "rb") as f:
        code = f.read()
    errors = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(
            b"\0".join(
                [code, " ".join(flags).encode(), _compiler_version(cc).encode(), _cpu_signature().encode()]
            )
        ).hexdigest()[:24]
        name = os.path.splitext(os.path.basename(source))[0]
        target = os.path.join(cache_dir(), f"{name}-{key}.so")
        if not os.path.exists(target):
            error = _build(cc, source, flags, target)
            if error is not None:
                errors.append(f"{' '.join(flags)}: {error}")
                continue
        try:
            return ctypes.CDLL(target)
        except OSError as e:
            errors.append(f"{target}: {e}")
    logger.warning("could not build %s with %s; using the torch fallback:\n%s", source, cc, "\n".join(errors))
    return None


_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_ATTN = [_P, _I, _I, _P, _I, _I, _P, _I, _I, _P, _P, _P, _I, _I, _I, _F]
# library name -> {C function: (argument types, return type)}; the library is ``<name>.c`` here
PROTOTYPES = {
    "varlen_attention": {
        "varlen_attn_fwd": ([*_ATTN, _P, _P, _I], ctypes.c_int),
        "varlen_attn_bwd": ([*_ATTN, _P, _P, _P, _P, _P, _P, _I], ctypes.c_int),
    },
    "rms_norm": {
        "rms_norm_fwd": ([_P, _P, _I, _I, _F, _P, _P], None),
        "rms_norm_bwd": ([_P, _P, _P, _P, _I, _I, _P, _P], None),
    },
}


def source(name: str) -> str:
    """The C file of library ``name``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.c")


@functools.cache
def library(name: str) -> ctypes.CDLL | None:
    """Library ``name`` (a key of ``PROTOTYPES``) with its functions' prototypes set, built now if
    not cached; None where native code is disabled or does not build. Once per process: call
    ``library.cache_clear()`` to look again."""
    lib = load(source(name))
    if lib is not None:
        for function, (argtypes, restype) in PROTOTYPES[name].items():
            getattr(lib, function).argtypes = argtypes
            getattr(lib, function).restype = restype
    return lib
