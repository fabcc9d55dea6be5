"""``allocation_mode``: which model workers run each model function call, in what parallel layout.

ReaL's grammar (``realrl.api.core.layout``), for the whole experiment, per model role or per MFC:

- ``"d2"``, ``"d2m1p1"``, ``"d1m2p1"``: every call in that layout on workers ``0 .. n-1``
  (``n = dp * tp * pp``); roles share the workers. The layout is meant for the models: a role
  without weights (a reward function, the advantage computation) runs replicated, ``d<n>m1p1``,
  on the same workers; so it does under ``*``. Only a layout that names such a role is its own.
- ``"actor:d1m2p1,critic:d2m1p1@2,*:d2"``: per role; ``@<first>`` places the layout on workers
  ``first .. first + n - 1`` (default 0); ``*`` gives every call not named a default.
- ``"actor_gen:d2m1p1,actor_train:d1m2p1,*:d1"``: per MFC. The calls of one model may use
  different layouts: the model's weights move between them as the graph runs (reallocation).
  An MFC's own entry beats its role's, which beats ``*``.
- ``"manual"`` with ``manual={name: [worker, ...]}`` (and optionally ``manual_layouts={name:
  "d1m2p1"}``): the worker of every layout rank, keyed by MFC name or by role (an MFC's own
  entry first).

A call that must see the whole batch (``MFCDef.whole_batch``, e.g. the advantage computation) runs
on the first worker of the placement it is given, in layout d1m1p1 (on worker 0 when none names it).

A model's **home** is the placement of its training call (else of its first call): its weights
and optimizer state live there; a call in another placement runs on a copy reallocated from home.
The number of model workers follows from the layouts (one more than the largest worker used).
On a hydra command line, quote a value with commas: ``'allocation_mode="actor:d1m2p1,*:d1"'``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence

from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.layout import Layout, Placement

_WITH_FIRST = re.compile(r"^(?P<layout>[^@]+?)(?:@(?P<first>\d+))?$")


@dataclasses.dataclass(frozen=True)
class Allocation:
    """Every MFC's placement, and every role's home placement."""

    calls: dict[str, Placement]
    homes: dict[str, Placement]


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
    weightless: Collection[str] = (),
) -> Allocation:
    """The placement of every MFC of ``mfcs`` and the home of every role they use; the roles in
    ``weightless`` hold no weights to split (see ``_replicated``)."""
    mode = allocation_mode.strip()
    if mode == "manual":
        calls = _manual(mfcs, manual or {}, manual_layouts or {})
    elif manual or manual_layouts:
        raise ValueError(
            f"manual worker lists given but allocation_mode is {allocation_mode!r}, not 'manual'"
        )
    elif ":" not in mode:
        layout, first = _parse_layout(mode, "allocation_mode")
        calls = {m.name: _replicated(_placed(layout, first), m.role, weightless) for m in mfcs}
    else:
        calls = _per_name(allocation_mode, mfcs, weightless)
    for m in mfcs:
        if m.whole_batch:
            calls[m.name] = _placed(Layout(), calls[m.name].workers[0] if m.name in calls else 0)
    return Allocation(calls, _homes(mfcs, calls))


def _replicated(placement: Placement, role: str, weightless: Collection[str]) -> Placement:
    """A layout given for every role is meant for the models: a role in ``weightless`` has
    nothing to split, so it runs data parallel over the same workers."""
    if role not in weightless:
        return placement
    return Placement(Layout(dp=len(placement.workers)), placement.workers)


def _per_name(
    allocation_mode: str, mfcs: Sequence[MFCDef], weightless: Collection[str]
) -> dict[str, Placement]:
    roles, names = _roles(mfcs), [m.name for m in mfcs]
    given: dict[str, Placement] = {}
    for part in allocation_mode.split(","):
        name, sep, spec = part.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ValueError(
                f"allocation_mode part {part!r} must be '<role or MFC>:d<dp>m<tp>p<pp>[@<first>]' "
                f"(in {allocation_mode!r})"
            )
        if name != "*" and name not in roles and name not in names:
            raise ValueError(
                f"allocation_mode names {name!r}, neither a model role {roles} nor an MFC {sorted(names)}"
            )
        if name in given:
            raise ValueError(f"allocation_mode gives {name!r} twice")
        layout, first = _parse_layout(spec, f"allocation_mode: layout of {name!r}")
        given[name] = _placed(layout, first)
    calls, missing = {}, []
    for m in mfcs:
        placement = given.get(m.name) or given.get(m.role)
        if placement is None and "*" in given:
            placement = _replicated(given["*"], m.role, weightless)
        if placement is None:
            if not m.whole_batch:
                missing.append(m.name)
        else:
            calls[m.name] = placement
    if missing:
        lacking = sorted({m.role for m in mfcs if m.name in missing})
        raise ValueError(
            f"allocation_mode {allocation_mode!r} gives no layout for roles {lacking} (MFCs {missing}); "
            "add them or '*:d<dp>m<tp>p<pp>'"
        )
    return calls


def _homes(mfcs: Sequence[MFCDef], calls: Mapping[str, Placement]) -> dict[str, Placement]:
    """Each role's home: its training call's placement (one layout trains a model), else its
    first call's."""
    homes: dict[str, Placement] = {}
    trainer: dict[str, str] = {}
    for m in mfcs:
        if m.interface_type is not ModelInterfaceType.TRAIN_STEP:
            continue
        if m.role in trainer and calls[trainer[m.role]] != calls[m.name]:
            other = trainer[m.role]
            raise ValueError(
                f"MFCs {other!r} and {m.name!r} both train model {m.role!r} but in different placements "
                f"({calls[other]} and {calls[m.name]}): a model trains in one layout"
            )
        trainer.setdefault(m.role, m.name)
        homes[m.role] = calls[m.name]
    for m in mfcs:
        homes.setdefault(m.role, calls[m.name])
    return {role: homes[role] for role in sorted(homes)}


def _placed(layout: Layout, first: int) -> Placement:
    return Placement(layout, tuple(range(first, first + layout.world_size)))


def _manual(
    mfcs: Sequence[MFCDef], manual: Mapping[str, Sequence[int]], manual_layouts: Mapping[str, str]
) -> dict[str, Placement]:
    roles, names = _roles(mfcs), {m.name for m in mfcs}
    for what, keys in (("manual allocation", manual), ("manual_layouts", manual_layouts)):
        for key in keys:
            if key not in names and key not in roles:
                raise ValueError(f"{what} names {key!r}, neither an MFC {sorted(names)} nor a role {roles}")
    calls, missing = {}, []
    for m in mfcs:
        key = m.name if m.name in manual else m.role
        if key not in manual:
            if not m.whole_batch:
                missing.append(m.name)
            continue
        workers = [int(w) for w in manual[key]]
        if not workers or any(w < 0 for w in workers):
            raise ValueError(
                f"manual allocation {key!r}: {workers} must be a non-empty list of worker indices >= 0"
            )
        layout_key = m.name if m.name in manual_layouts else m.role
        text = manual_layouts.get(layout_key)
        layout = (
            Layout(dp=len(workers))
            if text is None
            else _parse_layout(str(text), f"manual_layouts[{layout_key!r}]")[0]
        )
        try:
            calls[m.name] = Placement(layout, tuple(workers))
        except ValueError as e:
            raise ValueError(f"manual allocation {key!r}: {e}") from None
    if missing:
        raise ValueError(
            f"manual allocation gives no workers for MFCs {missing} (keys are MFC names or roles)"
        )
    return calls
