"""``allocation_mode``: which model workers hold which model, in what parallel layout.

ReaL's grammar (``realrl.api.core.layout``), for the whole experiment or per model role:

- ``"d2"``, ``"d2m1p1"``, ``"d1m2p1"``: every role in that layout on workers ``0 .. n-1``
  (``n = dp * tp * pp``); roles share the workers.
- ``"actor:d1m2p1,critic:d2m1p1@2,*:d2"``: per role; ``@<first>`` places the layout on workers
  ``first .. first + n - 1`` (default 0); ``*`` gives every role not named a default.
- ``"manual"`` with ``manual={name: [worker, ...]}`` (and optionally ``manual_layouts={name:
  "d1m2p1"}``): the worker of every layout rank, keyed by MFC name or by role; MFCs of one role
  must agree (one layout per model).

The number of model workers follows from the layouts (one more than the largest worker used).
On a hydra command line, quote a value with commas: ``'allocation_mode="actor:d1m2p1,*:d1"'``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from realrl.api.core.dfg import MFCDef
from realrl.api.core.layout import Layout, Placement

_WITH_FIRST = re.compile(r"^(?P<layout>[^@]+?)(?:@(?P<first>\d+))?$")


def _parse_layout(text: str, where: str) -> tuple[Layout, int]:
    """``d2m1p1@3`` -> (Layout(2, 1, 1), first worker 3). ``where``: the key, for the message."""
    m = _WITH_FIRST.match(text.strip())
    try:
        if not m:
            raise ValueError("not of the form d<dp>[m<tp>][p<pp>][@<first worker>]")
        layout = Layout.parse(m.group("layout"))
    except ValueError as e:
        malformed = m is None or "is not a layout" in str(e)
        detail = "not of the form d<dp>[m<tp>][p<pp>][@<first worker>]" if malformed else str(e)
        raise ValueError(f"{where} {text!r}: {detail}, e.g. 'd2', 'd1m2p1' or 'd1@1'") from None
    return layout, int(m.group("first") or 0)


def _roles(mfcs: Sequence[MFCDef]) -> list[str]:
    return sorted({m.role for m in mfcs})


def parse_allocation(
    allocation_mode: str,
    mfcs: Sequence[MFCDef],
    manual: Mapping[str, Sequence[int]] | None = None,
    manual_layouts: Mapping[str, str] | None = None,
) -> dict[str, Placement]:
    """Role -> its placement (layout and the worker of every layout rank), for the roles the
    ``mfcs`` use."""
    roles = _roles(mfcs)
    mode = allocation_mode.strip()
    if mode == "manual":
        return _manual(mfcs, manual or {}, manual_layouts or {})
    if manual or manual_layouts:
        raise ValueError(
            f"manual worker lists given but allocation_mode is {allocation_mode!r}, not 'manual'"
        )
    if ":" not in mode:
        layout, first = _parse_layout(mode, "allocation_mode")
        return {role: _placed(layout, first) for role in roles}
    mfc_names = {m.name for m in mfcs}
    per_role: dict[str, Placement] = {}
    default = None
    for part in mode.split(","):
        name, sep, spec = part.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ValueError(
                f"allocation_mode part {part!r} must be '<role>:d<dp>m<tp>p<pp>[@<first>]' (in {allocation_mode!r})"
            )
        layout, first = _parse_layout(spec, f"allocation_mode: layout of {name!r}")
        if name == "*":
            default = _placed(layout, first)
        elif name in mfc_names and name not in roles:
            raise ValueError(
                f"allocation_mode names the call {name!r}: give layouts per model role {roles} "
                "(the calls of one model share its layout)"
            )
        elif name not in roles:
            raise ValueError(f"allocation_mode names role {name!r}, but the MFCs use roles {roles}")
        elif name in per_role:
            raise ValueError(f"allocation_mode gives role {name!r} twice")
        else:
            per_role[name] = _placed(layout, first)
    missing = [r for r in roles if r not in per_role]
    if missing and default is None:
        raise ValueError(
            f"allocation_mode {allocation_mode!r} gives no layout for roles {missing}; add them or '*:d<dp>m<tp>p<pp>'"
        )
    return {r: per_role.get(r, default) for r in roles}


def _placed(layout: Layout, first: int) -> Placement:
    return Placement(layout, tuple(range(first, first + layout.world_size)))


def _manual(
    mfcs: Sequence[MFCDef], manual: Mapping[str, Sequence[int]], manual_layouts: Mapping[str, str]
) -> dict[str, Placement]:
    by_name = {m.name: m for m in mfcs}
    roles = _roles(mfcs)

    def role_of(key: str, what: str) -> str:
        if key in by_name:
            return by_name[key].role
        if key in roles:
            return key
        raise ValueError(f"{what} names {key!r}, neither an MFC {sorted(by_name)} nor a role {roles}")

    layouts: dict[str, tuple[Layout, str]] = {}
    for key, text in manual_layouts.items():
        role = role_of(key, "manual_layouts")
        layout, _ = _parse_layout(str(text), f"manual_layouts[{key!r}]")
        if role in layouts and layouts[role][0] != layout:
            raise ValueError(
                f"manual_layouts: {layouts[role][1]!r} gives model {role!r} layout {layouts[role][0]} but "
                f"{key!r} gives {layout}; MFCs of one model must share its layout"
            )
        layouts[role] = (layout, key)
    out: dict[str, Placement] = {}
    source: dict[str, str] = {}
    for key, workers in manual.items():
        workers = [int(w) for w in workers]
        if not workers or any(w < 0 for w in workers):
            raise ValueError(
                f"manual allocation {key!r}: {workers} must be a non-empty list of worker indices >= 0"
            )
        role = role_of(key, "manual allocation")
        layout = layouts.get(role, (Layout(dp=len(workers)), key))[0]
        try:
            placement = Placement(layout, tuple(workers))
        except ValueError as e:
            raise ValueError(f"manual allocation {key!r}: {e}") from None
        if role in out and out[role] != placement:
            raise ValueError(
                f"manual allocation: {source[role]!r} puts model {role!r} on {list(out[role].workers)} but "
                f"{key!r} on {workers}; MFCs of one model must share its layout"
            )
        out[role], source[role] = placement, key
    missing = [r for r in roles if r not in out]
    if missing:
        raise ValueError(
            f"manual allocation gives no workers for roles {missing} (MFC names or roles as keys)"
        )
    return out
