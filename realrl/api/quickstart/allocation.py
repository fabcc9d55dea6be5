"""``allocation_mode``: which model workers hold which model, with what data-parallel size.

Accepted forms (tensor and pipeline sizes come in a later issue; only ``m1p1`` is accepted):

- ``"d2"`` or ``"d2m1p1"``: every model role on workers 0 and 1, data-parallel size 2.
- ``"actor:d2,critic:d1@1,ref:d1@0,reward:d1@1"``: per role, ``d<size>`` ranks starting at worker
  ``@<first>`` (default 0); ``*`` gives every role not named a default.
- ``"manual"`` with ``manual={name: [worker, ...]}``: the worker of every data-parallel rank, keyed
  by MFC name or by role; MFCs of one role must agree (one layout per model for now).

The result maps each role to the list of worker indices of its dp ranks (``ExperimentConfig.allocations``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from realrl.api.core.dfg import MFCDef

_PARALLEL = re.compile(r"^d(\d+)(?:m(\d+)p(\d+))?(?:@(\d+))?$")


def _parse_parallel(text: str, where: str) -> tuple[int, int]:
    """``d2m1p1@3`` -> (dp size 2, first worker 3)."""
    m = _PARALLEL.match(text.strip())
    if not m:
        raise ValueError(
            f"allocation {where}: {text!r} is not of the form d<dp>[m<tp>p<pp>][@<first worker>], e.g. 'd2' or 'd1@1'"
        )
    dp, tp, pp, first = m.groups()
    if (tp or "1") != "1" or (pp or "1") != "1":
        raise ValueError(
            f"allocation {where}: {text!r} asks for tensor/pipeline parallelism (m{tp}p{pp}); only m1p1 is supported"
        )
    if int(dp) < 1:
        raise ValueError(f"allocation {where}: data-parallel size must be >= 1 in {text!r}")
    return int(dp), int(first or 0)


def _roles(mfcs: Sequence[MFCDef]) -> list[str]:
    return sorted({m.role for m in mfcs})


def parse_allocation(
    allocation_mode: str,
    mfcs: Sequence[MFCDef],
    manual: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, list[int]]:
    """Role -> worker index of each data-parallel rank, for the roles the ``mfcs`` use."""
    roles = _roles(mfcs)
    mode = allocation_mode.strip()
    if mode == "manual":
        return _manual(mfcs, manual or {})
    if manual:
        raise ValueError(
            f"manual worker lists given but allocation_mode is {allocation_mode!r}, not 'manual'"
        )
    if ":" not in mode:
        dp, first = _parse_parallel(mode, "mode")
        return {role: list(range(first, first + dp)) for role in roles}
    per_role: dict[str, list[int]] = {}
    default = None
    for part in mode.split(","):
        name, sep, spec = part.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ValueError(
                f"allocation_mode part {part!r} must be '<role>:d<dp>[@<first>]' (in {allocation_mode!r})"
            )
        dp, first = _parse_parallel(spec, f"of {name!r}")
        workers = list(range(first, first + dp))
        if name == "*":
            default = workers
        elif name not in roles:
            raise ValueError(f"allocation_mode names role {name!r}, but the MFCs use roles {roles}")
        elif name in per_role:
            raise ValueError(f"allocation_mode gives role {name!r} twice")
        else:
            per_role[name] = workers
    missing = [r for r in roles if r not in per_role]
    if missing and default is None:
        raise ValueError(
            f"allocation_mode {allocation_mode!r} gives no layout for roles {missing}; add them or '*:d<dp>'"
        )
    return {r: per_role.get(r, default) for r in roles}


def _manual(mfcs: Sequence[MFCDef], manual: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    by_name = {m.name: m for m in mfcs}
    roles = _roles(mfcs)
    out: dict[str, list[int]] = {}
    source: dict[str, str] = {}
    for key, workers in manual.items():
        workers = [int(w) for w in workers]
        if not workers or any(w < 0 for w in workers):
            raise ValueError(
                f"manual allocation {key!r}: {workers} must be a non-empty list of worker indices >= 0"
            )
        if key in by_name:
            role = by_name[key].role
        elif key in roles:
            role = key
        else:
            raise ValueError(
                f"manual allocation names {key!r}, neither an MFC {sorted(by_name)} nor a role {roles}"
            )
        if role in out and out[role] != workers:
            raise ValueError(
                f"manual allocation: {source[role]!r} puts model {role!r} on {out[role]} but {key!r} on {workers}; "
                "MFCs of one model must share its layout"
            )
        out[role], source[role] = workers, key
    missing = [r for r in roles if r not in out]
    if missing:
        raise ValueError(
            f"manual allocation gives no workers for roles {missing} (MFC names or roles as keys)"
        )
    return out
