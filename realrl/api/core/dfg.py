"""An algorithm as a dataflow graph of model function calls (MFCs).

Edges are derived from keys: a node that consumes a key depends on the node that produces it;
keys nobody produces come from the dataset (docs/algorithms.md). ``input_keys`` and ``output_keys``
are the graph-level names; the remaps translate them to and from the names the interface uses.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Iterable, Sequence

import networkx as nx

from realrl.api.core.config import ModelInterfaceAbstraction, ModelName
from realrl.api.core.data_api import MicroBatchSpec


class ModelInterfaceType(str, enum.Enum):
    GENERATE = "generate"
    INFERENCE = "inference"
    TRAIN_STEP = "train_step"
    EVALUATE = "evaluate"


@dataclasses.dataclass
class MFCDef:
    """One model function call: run ``interface_impl.<interface_type>`` on ``model_name``."""

    name: str
    model_name: ModelName | str
    interface_type: ModelInterfaceType | str
    interface_impl: ModelInterfaceAbstraction | str
    n_seqs: int = 1
    input_keys: tuple[str, ...] = ()
    output_keys: tuple[str, ...] = ()
    input_key_remap: dict[str, str] = dataclasses.field(default_factory=dict)
    output_key_remap: dict[str, str] = dataclasses.field(default_factory=dict)
    mb_spec: MicroBatchSpec = dataclasses.field(default_factory=MicroBatchSpec)
    log_return_value: bool = False
    # the call's statistics are over the whole batch (advantage whitening, the KL controller): it
    # runs on one worker, the first of the placement the allocation gives it
    whole_batch: bool = False
    # run on the model's base weights, its LoRA adapters off: a LoRA actor serves as its own
    # reference model (the base never trains, so this is exactly the reference policy)
    base_weights: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("MFCDef.name must be non-empty")
        self.model_name = ModelName.parse(self.model_name)
        try:
            self.interface_type = ModelInterfaceType(self.interface_type)
        except ValueError:
            allowed = [t.value for t in ModelInterfaceType]
            raise ValueError(
                f"MFC {self.name!r}: interface_type {self.interface_type!r} not in {allowed}"
            ) from None
        if isinstance(self.interface_impl, str):
            self.interface_impl = ModelInterfaceAbstraction(self.interface_impl)
        if self.n_seqs < 1:
            raise ValueError(f"MFC {self.name!r}: n_seqs must be >= 1, got {self.n_seqs}")
        self.input_keys = tuple(self.input_keys)
        self.output_keys = tuple(self.output_keys)
        for field, keys in (("input_keys", self.input_keys), ("output_keys", self.output_keys)):
            if len(set(keys)) != len(keys):
                raise ValueError(f"MFC {self.name!r}: {field} {keys} repeat a key")
        stray = set(self.input_key_remap) - set(self.input_keys)
        if stray:
            raise ValueError(f"MFC {self.name!r}: input_key_remap names {sorted(stray)} not in input_keys")

    @property
    def role(self) -> str:
        return self.model_name.role


def build_graph(nodes: Sequence[MFCDef], dataset_keys: Iterable[str] | None = None) -> nx.DiGraph:
    """The ``networkx.DiGraph`` of ``nodes``; each edge carries the ``keys`` it moves.

    Raises ``ValueError`` naming the nodes and keys for duplicate names, two producers of one key,
    a key produced by both the dataset and a node, a cycle, or (when ``dataset_keys`` is given)
    a key that nobody provides.
    """
    names = [n.name for n in nodes]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"duplicate MFC names: {dups}")

    producer: dict[str, str] = {}
    for node in nodes:
        for key in node.output_keys:
            if key in producer:
                raise ValueError(f"key {key!r} is produced by two MFCs: {producer[key]!r} and {node.name!r}")
            producer[key] = node.name

    dataset_keys = None if dataset_keys is None else set(dataset_keys)
    if dataset_keys is not None:
        both = sorted(dataset_keys & set(producer))
        if both:
            raise ValueError(
                "keys provided by the dataset are also produced by MFCs: "
                + ", ".join(f"{k!r} (by {producer[k]!r})" for k in both)
            )

    graph = nx.DiGraph()
    for node in nodes:
        graph.add_node(node.name, mfc=node)
    missing: dict[str, list[str]] = {}
    for node in nodes:
        for key in node.input_keys:
            if key in producer:
                src = producer[key]
                if graph.has_edge(src, node.name):
                    graph.edges[src, node.name]["keys"].append(key)
                else:
                    graph.add_edge(src, node.name, keys=[key])
            elif dataset_keys is not None and key not in dataset_keys:
                missing.setdefault(key, []).append(node.name)
    if missing:
        raise ValueError(
            "keys nobody provides (neither the dataset nor any MFC): "
            + "; ".join(f"{k!r} needed by {v}" for k, v in sorted(missing.items()))
            + f". Dataset keys: {sorted(dataset_keys or [])}"
        )
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
        raise ValueError(f"the MFC graph has a cycle: {path}")
    graph.graph["dataset_keys"] = sorted(
        dataset_keys if dataset_keys is not None else {k for n in nodes for k in n.input_keys} - set(producer)
    )
    return graph


def graph_to_dot(graph: nx.DiGraph) -> str:
    """Graphviz DOT text: one box per MFC, labelled with its model and call type."""
    lines = ["digraph mfc {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
    if graph.graph.get("dataset_keys"):
        lines.append('  dataset [shape=cylinder, label="dataset"];')
    for name, attrs in graph.nodes(data=True):
        mfc: MFCDef = attrs["mfc"]
        label = f"{name}\\n{mfc.model_name} · {mfc.interface_type.value}"
        lines.append(f'  "{name}" [label="{label}"];')
        from_dataset = [k for k in mfc.input_keys if k in graph.graph.get("dataset_keys", [])]
        if from_dataset:
            lines.append(f'  dataset -> "{name}" [label="{", ".join(from_dataset)}"];')
    for src, dst, attrs in graph.edges(data=True):
        lines.append(f'  "{src}" -> "{dst}" [label="{", ".join(attrs["keys"])}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_graph(graph: nx.DiGraph, path: str) -> str:
    """Write the graph to ``path``: ``.dot`` as DOT text, ``.png`` as a picture (matplotlib) laid
    out by ``dfg_layout.layout_graph``, so that no key label covers another label or a node."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".dot":
        with open(path, "w") as f:
            f.write(graph_to_dot(graph))
        return path
    if ext != ".png":
        raise ValueError(f"draw_graph writes .dot or .png, not {ext!r} ({path})")
    from realrl.api.core.dfg_draw import render_png
    from realrl.api.core.dfg_layout import layout_graph

    return render_png(layout_graph(graph), path)
