"""Print and draw an algorithm's dataflow graph: ``python -m realrl.apps.graph ppo --out ppo.png``."""

from __future__ import annotations

import argparse

from realrl.api.core.dfg import build_graph, draw_graph, graph_to_dot
from realrl.apps.help_text import plain
from realrl.experiments.ppo_graph import PPO_DATASET_KEYS, ppo_mfcs

GRAPHS = {"ppo": (lambda n: ppo_mfcs(n), PPO_DATASET_KEYS)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m realrl.apps.graph", description=plain(__doc__))
    parser.add_argument("experiment", choices=sorted(GRAPHS))
    parser.add_argument("--n-seqs", type=int, default=8, help="samples per model function call")
    parser.add_argument("--out", help="write the graph here (.dot or .png)")
    args = parser.parse_args(argv)
    make_nodes, dataset_keys = GRAPHS[args.experiment]
    graph = build_graph(make_nodes(args.n_seqs), dataset_keys)
    print(graph_to_dot(graph), end="")
    for name in graph.nodes:
        mfc = graph.nodes[name]["mfc"]
        print(
            f"# {name}: {mfc.model_name} {mfc.interface_type.value} {list(mfc.input_keys)} -> {list(mfc.output_keys)}"
        )
    if args.out:
        print(f"# wrote {draw_graph(graph, args.out)}")


if __name__ == "__main__":
    main()
