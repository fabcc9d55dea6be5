"""A model's parallel layout: data, tensor ("model") and pipeline parallel sizes, as a value.

Written in ReaL's grammar, ``d<dp>m<tp>p<pp>`` (``d2m4p1``: two data-parallel replicas, each split
over four tensor-parallel ranks). A layout with ``n = dp * tp * pp`` ranks runs on ``n`` model
workers; rank ``r`` of the layout sits at ``(pp, dp, tp)`` coordinates with tp varying fastest,
so the tensor-parallel ranks of a replica are neighbouring workers (one node, fast links).

Nothing here touches torch.distributed: the master plans with layouts, the workers turn them into
device meshes (``realrl.impl.model.parallel``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

_GRAMMAR = re.compile(r"^d(\d+)(?:m(\d+))?(?:p(\d+))?$")


@dataclasses.dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp"):
            if getattr(self, name) < 1:
                raise ValueError(f"Layout.{name} must be >= 1, got {getattr(self, name)} in {self}")

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``"d2m2p1"``, ``"d2m2"`` or ``"d2"`` (missing sizes are 1)."""
        m = _GRAMMAR.match(text.strip())
        if not m:
            raise ValueError(
                f"{text!r} is not a layout of the form d<dp>m<tp>p<pp>, e.g. 'd2m1p1' or 'd1m2p1'"
            )
        dp, tp, pp = (int(g) if g else 1 for g in m.groups())
        return cls(dp, tp, pp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) ranks of layout rank ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside layout {self} of {self.world_size} ranks")
        pp, rest = divmod(rank, self.dp * self.tp)
        dp, tp = divmod(rest, self.tp)
        return pp, dp, tp

    def rank(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def __str__(self) -> str:
        return f"d{self.dp}m{self.tp}p{self.pp}"


@dataclasses.dataclass(frozen=True)
class Placement:
    """A model on workers: ``workers[r]`` runs layout rank ``r``."""

    layout: Layout
    workers: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(int(w) for w in self.workers))
        if len(self.workers) != self.layout.world_size:
            raise ValueError(
                f"layout {self.layout} has {self.layout.world_size} ranks but {len(self.workers)} workers "
                f"were given ({list(self.workers)})"
            )
        if len(set(self.workers)) != len(self.workers):
            raise ValueError(
                f"placement {list(self.workers)} puts two ranks of layout {self.layout} on one worker"
            )

    @classmethod
    def data_parallel(cls, workers: list[int] | tuple[int, ...]) -> Placement:
        return cls(Layout(dp=len(workers)), tuple(workers))

    def replica(self, dp_rank: int) -> list[int]:
        """The workers of data-parallel rank ``dp_rank`` (its tp x pp ranks), in layout order."""
        lay = self.layout
        return [self.workers[lay.rank(p, dp_rank, t)] for p in range(lay.pp) for t in range(lay.tp)]

    def replicas(self) -> list[list[int]]:
        return [self.replica(d) for d in range(self.layout.dp)]

    def heads(self) -> list[int]:
        """One worker per data-parallel rank (tp and pp rank 0): where a replica's data lives."""
        return [r[0] for r in self.replicas()]

    def coords_of(self, worker: int) -> tuple[int, int, int]:
        return self.layout.coords(self.workers.index(worker))

    def __str__(self) -> str:
        """``d2m1p1@2,3``: the layout and its workers, rank by rank."""
        return f"{self.layout}@{','.join(map(str, self.workers))}"


def node_groups(placements: Iterable[Placement], n_workers: int) -> list[list[int]]:
    """The workers that must share a node: those of one data-parallel replica of any placement
    (its tensor-parallel ranks exchange every layer's activations, its pipeline stages every
    micro-batch's) are joined, transitively; every other worker is a group of its own. Groups in
    order of their first worker."""
    parent = list(range(n_workers))

    def root(w: int) -> int:
        while parent[w] != w:
            parent[w] = parent[parent[w]]
            w = parent[w]
        return w

    for placement in placements:
        for replica in placement.replicas():
            for w in replica[1:]:
                parent[root(w)] = root(replica[0])
    groups: dict[int, list[int]] = {}
    for w in range(n_workers):
        groups.setdefault(root(w), []).append(w)
    return sorted(groups.values())
