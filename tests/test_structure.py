"""The package's shape, checked on every run: imports point one way through the layers and never
in a circle, files stay small and say what they own, and asynchronous RL lives in its policy."""

from __future__ import annotations

import ast
import pathlib

import networkx as nx
import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "realrl"
LAYERS = ["base", "api", "impl", "experiments", "system", "apps"]  # each imports only those before it
MAX_LINES = 450


def _modules() -> dict[str, pathlib.Path]:
    root = PACKAGE.parent
    return {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """Every module of the package ``path`` imports, anywhere in the file (inside functions and
    under TYPE_CHECKING too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        out.update(t for t in targets if t in modules and modules[t].name != "__init__.py")
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    modules = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for name, path in modules.items():
        g.add_edges_from((name, t) for t in _imports(path, modules) if t != name)
    return g


def test_no_two_modules_import_each_other(graph):
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert circles == []


def test_imports_point_one_way_through_the_layers(graph):
    upward = [
        f"{a} imports {b}"
        for a, b in graph.edges
        if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)
    ]
    assert upward == []


def test_files_are_small_and_open_with_what_they_own():
    sizes = {
        p.relative_to(PACKAGE.parent).as_posix(): len(p.read_text().splitlines()) for p in _modules().values()
    }
    assert {f: n for f, n in sizes.items() if n > MAX_LINES} == {}
    assert sizes["realrl/system/master_worker.py"] < 400
    undocumented = [
        f
        for f, p in ((p.relative_to(PACKAGE.parent).as_posix(), p) for p in _modules().values())
        if p.read_text().strip() and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert undocumented == []


def test_the_runtime_asks_the_asynchrony_policy_not_the_config():
    """Whether a run is asynchronous is read in the policy's two modules only."""
    system = PACKAGE / "system"
    readers = sorted(p.name for p in system.glob("*.py") if "async_rl" in p.read_text())
    assert readers == ["asynchrony.py", "version_rule.py"]
