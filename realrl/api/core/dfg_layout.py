"""Where each box of a dataflow-graph picture goes, computed without drawing anything.

Labels drawn on top of a spring or multipartite layout land on each other and on the nodes, so
the picture is laid out in columns instead: one column per topological generation of MFCs (the
dataset, when it feeds the graph, is the first), a column of key labels after each (one label per
edge, listing the keys it moves), and an empty waypoint in every column an edge skips over.
Every box and waypoint has a vertical slot of its own in its column and edges bend only in the
gaps between columns, so nothing overlaps by construction; ``GraphLayout`` keeps the numbers
that let a test check it without rendering. Lengths are typographic points (1/72 inch), the
text monospace, so a box's size follows from its text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import networkx as nx

DATASET = "<dataset>"  # the input node's id: no MFC is called this, "dataset" could be
MONO_ADVANCE = 0.61  # DejaVu Sans Mono's advance is 0.602 em; rounded up so text always fits
NODE_FONT = 9.0
KEY_FONT = 7.5
LINE_SPACING = 1.3
PAD_X, PAD_Y = 6.0, 4.0
COLUMN_GAP = 36.0
ROW_GAP = 12.0
WAYPOINT_HEIGHT = 4.0
MARGIN = 8.0
SWEEPS = 4


@dataclasses.dataclass(frozen=True)
class Box:
    """One rectangle of the picture: an MFC, the dataset, the keys of an edge, or a waypoint."""

    id: str
    kind: str  # "mfc", "dataset", "keys" or "waypoint"
    lines: tuple[str, ...]
    font: float
    x: float  # centre
    y: float  # centre
    w: float
    h: float
    call: str = ""  # the MFC's interface type, for its colour

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        return self.x - self.w / 2, self.y - self.h / 2, self.x + self.w / 2, self.y + self.h / 2

    def overlaps(self, other: Box) -> bool:
        ax0, ay0, ax1, ay1 = self.bounds
        bx0, by0, bx1, by1 = other.bounds
        return ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1


@dataclasses.dataclass(frozen=True)
class Route:
    """An edge's path: ``points[2i] -> points[2i+1]`` run straight inside a column,
    ``points[2i+1] -> points[2i+2]`` bend across the gap to the next column."""

    src: str
    dst: str
    keys: tuple[str, ...]
    label: str  # the id of the box listing ``keys``
    points: tuple[tuple[float, float], ...]


@dataclasses.dataclass(frozen=True)
class GraphLayout:
    """Every box by id (an MFC's name, ``DATASET``, ``keys:<src>-><dst>``, ``via:...``), every
    edge's route, and the picture's size."""

    boxes: dict[str, Box]
    routes: tuple[Route, ...]
    width: float
    height: float

    def nodes(self) -> list[Box]:
        return [b for b in self.boxes.values() if b.kind in ("mfc", "dataset")]


def _text_size(lines: Sequence[str], font: float) -> tuple[float, float]:
    """Rounded up to quarter points: sums of quarters are exact in floating point, so a box's
    edge and its column's edge compare equal."""
    width = max(len(line) for line in lines) * font * MONO_ADVANCE + 2 * PAD_X
    height = len(lines) * font * LINE_SPACING + 2 * PAD_Y
    return math.ceil(width * 4) / 4, math.ceil(height * 4) / 4


def _edges(graph: nx.DiGraph) -> list[tuple[str, str, tuple[str, ...]]]:
    """Every edge with its keys, the dataset's edges first (to the MFCs reading its keys)."""
    from_dataset = set(graph.graph.get("dataset_keys", []))
    edges = []
    for name, attrs in graph.nodes(data=True):
        keys = tuple(k for k in attrs["mfc"].input_keys if k in from_dataset)
        if keys:
            edges.append((DATASET, name, keys))
    edges += [(u, v, tuple(d["keys"])) for u, v, d in graph.edges(data=True)]
    return edges


def _order(columns: list[list[str]], links: list[tuple[str, str]]) -> None:
    """Reorder each column in place by the mean position of its neighbours (barycentre
    heuristic), sweeping right and left, so fewer edges cross."""
    prev: dict[str, list[str]] = {}
    nxt: dict[str, list[str]] = {}
    for a, b in links:
        nxt.setdefault(a, []).append(b)
        prev.setdefault(b, []).append(a)
    for sweep in range(SWEEPS):
        forward = sweep % 2 == 0
        indices = range(1, len(columns)) if forward else range(len(columns) - 2, -1, -1)
        for c in indices:
            ref = columns[c - 1] if forward else columns[c + 1]
            where = {item: i for i, item in enumerate(ref)}
            near = prev if forward else nxt
            current = {item: i for i, item in enumerate(columns[c])}

            def centre(item: str, where=where, near=near, current=current) -> tuple[float, int]:
                seen = [where[n] for n in near.get(item, []) if n in where]
                return (sum(seen) / len(seen) if seen else current[item], current[item])

            columns[c].sort(key=centre)


def layout_graph(graph: nx.DiGraph) -> GraphLayout:
    """Columns, boxes and edge routes for ``graph`` (from ``build_graph``); a pure function."""
    edges = _edges(graph)
    first = 2 if any(src == DATASET for src, _, _ in edges) else 0
    rank = {n: first + 2 * g for g, gen in enumerate(nx.topological_generations(graph)) for n in gen}
    if first:
        rank[DATASET] = 0
    columns: list[list[str]] = [[] for _ in range(max(rank.values(), default=0) + 1)]
    sizes: dict[str, tuple[str, tuple[str, ...], float, str]] = {}  # kind, lines, font, call
    if first:
        columns[0].append(DATASET)
        sizes[DATASET] = ("dataset", ("dataset",), NODE_FONT, "")
    for name, attrs in graph.nodes(data=True):
        mfc = attrs["mfc"]
        columns[rank[name]].append(name)
        call = mfc.interface_type.value
        sizes[name] = ("mfc", (name, f"{mfc.model_name} · {call}"), NODE_FONT, call)
    chains, links = [], []
    for src, dst, keys in edges:
        label = f"keys:{src}->{dst}"
        sizes[label] = ("keys", keys, KEY_FONT, "")
        chain = [src]
        for r in range(rank[src] + 1, rank[dst]):
            item = label if r == rank[src] + 1 else f"via:{src}->{dst}@{r}"
            if item != label:
                sizes[item] = ("waypoint", (), KEY_FONT, "")
            columns[r].append(item)
            chain.append(item)
        chain.append(dst)
        chains.append((src, dst, keys, label, chain))
        links += list(zip(chain, chain[1:]))
    _order(columns, links)
    return _place(columns, sizes, chains)


def _place(
    columns: list[list[str]],
    sizes: dict[str, tuple[str, tuple[str, ...], float, str]],
    chains: list[tuple[str, str, tuple[str, ...], str, list[str]]],
) -> GraphLayout:
    """Stack each column's items evenly around the middle height; columns side by side."""
    dims = {
        item: (0.0, WAYPOINT_HEIGHT) if kind == "waypoint" else _text_size(lines, font)
        for item, (kind, lines, font, _) in sizes.items()
    }
    col_w = [max((dims[i][0] for i in col), default=0.0) for col in columns]
    col_h = [sum(dims[i][1] for i in col) + ROW_GAP * max(len(col) - 1, 0) for col in columns]
    height = max(col_h, default=0.0) + 2 * MARGIN
    boxes: dict[str, Box] = {}
    col_x: list[tuple[float, float]] = []  # each column's left and right edge
    left = MARGIN
    for col, w, h in zip(columns, col_w, col_h):
        col_x.append((left, left + w))
        top = (height + h) / 2
        for item in col:
            kind, lines, font, call = sizes[item]
            iw, ih = dims[item]
            boxes[item] = Box(item, kind, lines, font, left + w / 2, top - ih / 2, iw, ih, call)
            top -= ih + ROW_GAP
        left += w + COLUMN_GAP
    where = {item: c for c, col in enumerate(columns) for item in col}
    out_y = _ports(boxes, [(chain[0], chain[1]) for *_, chain in chains])
    in_y = _ports(boxes, [(chain[-1], chain[-2]) for *_, chain in chains])
    routes = []
    for n, (src, dst, keys, label, chain) in enumerate(chains):
        points = [(boxes[src].bounds[2], out_y[n]), (col_x[where[src]][1], out_y[n])]
        for item in chain[1:-1]:
            points += [(col_x[where[item]][0], boxes[item].y), (col_x[where[item]][1], boxes[item].y)]
        points += [(col_x[where[dst]][0], in_y[n]), (boxes[dst].bounds[0], in_y[n])]
        routes.append(Route(src, dst, keys, label, tuple(points)))
    width = left - COLUMN_GAP + MARGIN if columns else 2 * MARGIN
    return GraphLayout(boxes, tuple(routes), width, height)


def _ports(boxes: dict[str, Box], ends: list[tuple[str, str]]) -> list[float]:
    """The height at which each edge leaves or enters its node: ``ends[i]`` is (the node, the
    edge's next item towards the other end). A node's edges are spread over the middle of its
    side in the order of their neighbours' heights, so arrow heads do not pile into one."""
    by_node: dict[str, list[int]] = {}
    for i, (node, _) in enumerate(ends):
        by_node.setdefault(node, []).append(i)
    ys = [0.0] * len(ends)
    for node, edges in by_node.items():
        box = boxes[node]
        edges.sort(key=lambda i: -boxes[ends[i][1]].y)
        span = box.h - 2 * PAD_Y
        for rank, i in enumerate(edges):
            ys[i] = box.y + span / 2 - span * (rank + 1) / (len(edges) + 1)
    return ys
