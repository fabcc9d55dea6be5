"""Render a ``GraphLayout`` to a PNG with matplotlib, at the layout's own scale.

The axes span the whole figure and one data unit is one point, so each box drawn is exactly the
rectangle the layout reserved for it and the text inside fits as the layout computed.
"""

from __future__ import annotations

import os

from realrl.api.core.dfg_layout import LINE_SPACING, GraphLayout, Route

FONT = "DejaVu Sans Mono"  # shipped with matplotlib; the layout measures text in its advance
CALL_COLOURS = {
    "generate": "#d9ead3",
    "inference": "#cfe2f3",
    "train_step": "#fce5cd",
    "evaluate": "#ead1dc",
}
DATASET_COLOUR = "#eeeeee"
EDGE_COLOUR = "#555555"


def _route_path(route: Route):
    """Straight runs inside columns, S-bends (horizontal at both ends) between them."""
    from matplotlib.path import Path

    pts = route.points
    verts, codes = [pts[0]], [Path.MOVETO]
    for i in range(1, len(pts)):
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        if i % 2:  # inside a column; a run of length 0 would leave the arrow head no direction
            if abs(x1 - x0) < 0.5:
                continue
            verts.append((x1, y1))
            codes.append(Path.LINETO)
        else:
            mid = (x0 + x1) / 2
            verts += [(mid, y0), (mid, y1), (x1, y1)]
            codes += [Path.CURVE4] * 3
    return Path(verts, codes)


def render_png(layout: GraphLayout, path: str, dpi: int = 150) -> str:
    """Write ``layout`` to ``path`` (atomically: a reader never sees half a PNG)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    fig = plt.figure(figsize=(layout.width / 72, layout.height / 72))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, layout.width)
    ax.set_ylim(0, layout.height)
    ax.set_axis_off()
    for route in layout.routes:
        ax.add_patch(
            FancyArrowPatch(
                path=_route_path(route),
                arrowstyle="-|>",
                mutation_scale=9,
                color=EDGE_COLOUR,
                linewidth=0.9,
                shrinkA=0,
                shrinkB=0,
                zorder=1,
            )
        )
    for box in layout.boxes.values():
        if box.kind == "waypoint":
            continue
        x0, y0, _, _ = box.bounds
        if box.kind == "keys":
            face, edge, line = "white", "#aaaaaa", 0.6
        else:
            face = CALL_COLOURS.get(box.call, DATASET_COLOUR)
            edge, line = "#333333", 0.9
        ax.add_patch(Rectangle((x0, y0), box.w, box.h, facecolor=face, edgecolor=edge, lw=line, zorder=2))
        bold = box.kind != "keys"
        for i, text in enumerate(box.lines):
            ax.text(
                box.x,
                box.y + (len(box.lines) - 1 - 2 * i) * box.font * LINE_SPACING / 2,
                text,
                ha="center",
                va="center",
                fontsize=box.font,
                family=FONT,
                weight="bold" if bold and i == 0 else "normal",
                style="italic" if box.kind == "dataset" else "normal",
                zorder=3,
            )
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    os.replace(tmp, path)
    return path
