"""The dataflow-graph picture's layout, checked by its numbers: nothing overlaps, labels list
their edge's keys, MFCs of one generation share a column."""

import itertools
import random

import networkx as nx
import pytest

from realrl.api.core.dfg import MFCDef, build_graph, draw_graph
from realrl.api.core.dfg_layout import DATASET, GraphLayout, layout_graph
from realrl.apps.configs import build_config

EXPERIMENTS = ("ppo", "grpo", "sft", "rw", "dpo", "gen")


def assert_readable(layout: GraphLayout, graph: nx.DiGraph) -> None:
    boxes = list(layout.boxes.values())
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a.id, b.id)
    for box in boxes:
        x0, y0, x1, y1 = box.bounds
        assert 0 <= x0 and x1 <= layout.width and 0 <= y0 and y1 <= layout.height, box.id
    edges = {(u, v): tuple(d["keys"]) for u, v, d in graph.edges(data=True)}
    for route in layout.routes:
        label = layout.boxes[route.label]
        assert label.kind == "keys" and label.lines == route.keys
        if route.src != DATASET:
            assert edges.pop((route.src, route.dst)) == route.keys
        xs = [x for x, _ in route.points]
        assert xs == sorted(xs), route  # edges only go left to right
        own = {route.src, route.dst, route.label}
        for (x0, y), (x1, _) in zip(route.points[::2], route.points[1::2]):  # runs inside a column
            for box in boxes:
                bx0, by0, bx1, by1 = box.bounds
                if box.id not in own and box.kind != "waypoint":
                    assert not (by0 <= y <= by1 and x0 < bx1 and bx0 < x1), (route.src, route.dst, box.id)
    assert not edges, f"edges without a label: {sorted(edges)}"
    for generation in nx.topological_generations(graph):
        assert len({layout.boxes[n].x for n in generation}) == 1


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {n: build_graph(build_config(n, [f"fileroot={root}"]).initial_setup().mfcs) for n in EXPERIMENTS}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_quickstart_graphs_are_readable(graphs, name):
    graph = graphs[name]
    layout = layout_graph(graph)
    assert_readable(layout, graph)
    assert {b.id for b in layout.nodes()} == set(graph.nodes) | {DATASET}
    for name in graph.nodes:
        mfc = graph.nodes[name]["mfc"]
        assert layout.boxes[name].lines == (name, f"{mfc.model_name} · {mfc.interface_type.value}")


def test_ppo_columns_follow_generations(graphs):
    layout = layout_graph(graphs["ppo"])
    names = ("actor_gen", "rew_inf", "ref_inf", "critic_inf", "compute_adv", "actor_train")
    x = {n: layout.boxes[n].x for n in names}
    assert layout.boxes[DATASET].x < x["actor_gen"] < x["rew_inf"] == x["critic_inf"] < x["compute_adv"]
    assert x["compute_adv"] < x["actor_train"]
    assert layout.boxes[f"keys:{DATASET}->actor_gen"].lines == ("packed_prompts",)
    long_edge = next(r for r in layout.routes if (r.src, r.dst) == ("actor_gen", "actor_train"))
    # two points per column: the source, its label, waypoints past generations 1 and 2 and the
    # labels after each, the target
    assert len(long_edge.points) == 14


def test_random_graphs_are_readable():
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 9)
        nodes = []
        for i in range(n):
            inputs = [f"k{j}" for j in range(i) if rng.random() < 0.35] + ["prompt"] * (rng.random() < 0.5)
            nodes.append(
                MFCDef(f"mfc{i}", "actor", "inference", "x", input_keys=inputs, output_keys=[f"k{i}"])
            )
        graph = build_graph(nodes)
        assert_readable(layout_graph(graph), graph)


def test_layout_is_pure_and_png_matches_its_size(graphs, tmp_path):
    graph = graphs["ppo"]
    before = nx.to_dict_of_dicts(graph), dict(graph.nodes(data=True)), dict(graph.graph)
    layout = layout_graph(graph)
    assert layout == layout_graph(graph)
    assert (nx.to_dict_of_dicts(graph), dict(graph.nodes(data=True)), dict(graph.graph)) == before
    from PIL import Image

    png = draw_graph(graph, str(tmp_path / "g.png"))
    width, height = Image.open(png).size
    assert width == pytest.approx(layout.width / 72 * 150, abs=2)
    assert height == pytest.approx(layout.height / 72 * 150, abs=2)
