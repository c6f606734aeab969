"""The package's own import graph has no cycle (issue: structure).

Edges come from the code's ``import`` statements, read with ``ast`` (module
level and inside functions alike: a deferred import is still a dependency), so
a cycle hidden behind a function-level import is caught too. Importing
``a.b.c`` is an edge to ``a.b.c`` only, not to its parent packages (Python
runs the parents' ``__init__`` first, but a package importing its own
submodules is how a package registers them, not a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import vpay

ROOT = Path(vpay.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """``{module: {vpay modules it imports}}`` for every module under vpay/."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                # ``from pkg import sub`` names a submodule when one exists.
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("vpay"):
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == GREY:
                return stack[stack.index(nxt):] + [nxt]
            if colour.get(nxt) == WHITE:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE:
            found = visit(node)
            if found:
                return found
    return None


def test_vpay_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    # The check itself must be able to fail: a -> b -> c -> a is reported.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    # vpay/cli/worker.py imports vpay.worker.loop inside the command's body.
    assert "vpay.worker.loop" in graph["vpay.cli.worker"]
    assert "vpay.cli.common" in graph["vpay.cli.worker"]


def test_rails_hold_only_the_port_and_adapters():
    # The sandboxes are test doubles: nothing in vpay.rails imports them.
    graph = import_graph()
    for name, edges in graph.items():
        if name.startswith("vpay.rails"):
            assert not any(e.startswith("vpay.sandbox") for e in edges), name
