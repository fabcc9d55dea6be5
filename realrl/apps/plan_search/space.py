"""The execution plans a search considers: a placement for every model function call.

A call may run in any layout ``d<dp>m<tp>p1`` of at most ``n_workers`` ranks, on a block of
neighbouring workers that starts at a multiple of its size (tensor-parallel ranks stay on
neighbouring workers, within one node). A call that must see the whole batch runs on one worker.
Pipeline stages (``p > 1``, which the runtime runs) are not in the space yet: the profiles and
the simulator know calls on a (dp, tp) mesh only. A plan is written as an
``allocation_mode`` a user can paste: the most common placement as ``*``, the other calls by name.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from realrl.api.core.dfg import MFCDef
from realrl.api.core.layout import Layout, Placement
from realrl.api.core.system_api import ExperimentConfig, ModelSpec
from realrl.api.quickstart.allocation import parse_allocation


def layouts_up_to(n_workers: int, per_node: int | None = None) -> list[Layout]:
    """Every ``d<dp>m<tp>p1`` of at most ``n_workers`` ranks, smallest first; tensor parallelism
    within a node (``tp <= per_node``: its all-reduces run in every layer)."""
    return [
        Layout(dp, tp)
        for size in range(1, n_workers + 1)
        for tp in range(1, min(size, per_node or size) + 1)
        if size % tp == 0 and (dp := size // tp) >= 1
    ]


def call_options(mfc: MFCDef, n_workers: int, per_node: int | None = None) -> list[Placement]:
    """Where ``mfc`` may run on ``n_workers`` workers (``per_node`` of them in each node)."""
    layouts = [Layout()] if mfc.whole_batch else layouts_up_to(n_workers, per_node)
    return [
        Placement(layout, tuple(range(first, first + layout.world_size)))
        for layout in layouts
        for first in range(0, n_workers - layout.world_size + 1, layout.world_size)
    ]


@dataclasses.dataclass(frozen=True)
class Plan:
    """One placement per MFC, in graph order."""

    calls: tuple[tuple[str, Placement], ...]

    @classmethod
    def of(cls, mfcs: Sequence[MFCDef], placements: Sequence[Placement]) -> Plan:
        return cls(tuple((m.name, p) for m, p in zip(mfcs, placements, strict=True)))

    def allocation_mode(self) -> str:
        """The ``allocation_mode`` that places every call as this plan does."""
        counts = collections.Counter(p for _, p in self.calls)
        default, _ = max(counts.items(), key=lambda kv: (kv[1], -kv[0].workers[0], str(kv[0])))
        if len(counts) == 1:
            return _text(default)
        named = [f"{name}:{_text(p)}" for name, p in self.calls if p != default]
        return ",".join([*named, f"*:{_text(default)}"])

    def layouts(self) -> set[Layout]:
        return {p.layout for _, p in self.calls}


def _text(placement: Placement) -> str:
    first = placement.workers[0]
    return f"{placement.layout}" + (f"@{first}" if first else "")


def with_allocation(exp: ExperimentConfig, allocation_mode: str) -> ExperimentConfig:
    """``exp`` with every call placed as ``allocation_mode`` says (the same checks as building the
    experiment with it: a ``ValueError`` for a plan the runtime would refuse)."""
    allocation = parse_allocation(allocation_mode, exp.mfcs, weightless=ModelSpec.weightless(exp.models))
    homes = allocation.homes
    return dataclasses.replace(
        exp,
        allocations={role: list(p.workers) for role, p in homes.items()},
        layouts={role: p.layout for role, p in homes.items()},
        mfc_placements={m.name: p for m in exp.mfcs if (p := allocation.calls[m.name]) != homes[m.role]},
        n_model_workers=None,  # as many as the plan uses
    )
