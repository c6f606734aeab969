"""The direction of imports between the package's layers (issue 22,
docs/architecture.md "Layers"). Edges come from ``test_import_graph`` (every
``import``, at module level or inside a function).

    base  <-  engine  <-  money        (and the rail port, which money speaks to)
              engine  <-  worker
    edges (api, cli, console, handlers, rails, sandbox, statements, webhooks, demo) on top

The engine could be lifted out as a library: it imports only ``vpay.base``.
The money domain knows rails only through their port, never an adapter. The
worker process knows no job kind: the handlers are handed to it.
"""

from __future__ import annotations

import pytest

from test_import_graph import import_graph

LAYERS = ("base", "engine", "money", "worker")
ALLOWED = {
    "base": {"base"},
    "engine": {"base", "engine"},
    "money": {"base", "engine", "money", "port"},
    "worker": {"base", "engine", "worker"},
    "port": {"base", "port"},
}
"""What each layer may import. ``port`` is ``vpay.rails.port``: the rail port
belongs to the domain's side of the hexagon; the adapters are edges."""


def layer(module: str) -> str:
    """The layer of a ``vpay.…`` module: one of ``LAYERS``, ``port``, or ``edge``."""
    if module == "vpay.rails.port":
        return "port"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "edge"


def violations(graph: dict[str, set[str]]) -> list[str]:
    """``"a -> b (layer x may not import layer y)"`` for every edge against the rule."""
    found = []
    for module, targets in sorted(graph.items()):
        mine = layer(module)
        if mine == "edge":
            continue
        for target in sorted(targets):
            theirs = layer(target)
            if target == "vpay" or theirs in ALLOWED[mine]:
                continue
            found.append(f"{module} -> {target} ({mine} may not import {theirs})")
    return found


def test_every_layer_imports_only_the_layers_beneath_it():
    assert violations(import_graph()) == []


def test_each_layer_is_a_package_of_its_own():
    graph = import_graph()
    for name in LAYERS:
        assert f"vpay.{name}" in graph, f"vpay/{name}/ is missing"
    # Nothing but the layers, the edges' packages and the demo sits at the top.
    top = sorted(m for m in graph if m.count(".") == 1 and not any(
        m == f"vpay.{p}" for p in LAYERS + ("api", "cli", "console", "handlers", "rails",
                                             "sandbox", "statements", "webhooks")))
    assert top == ["vpay.demo"]


@pytest.mark.parametrize("edge, expected", [
    ({"vpay.engine.queue": {"vpay.money.charges"}}, "engine may not import money"),
    ({"vpay.engine.queue": {"vpay.handlers.registry"}}, "engine may not import edge"),
    ({"vpay.money.charges": {"vpay.rails.mtn"}}, "money may not import edge"),
    ({"vpay.money.charges": {"vpay.worker.loop"}}, "money may not import worker"),
    ({"vpay.worker.loop": {"vpay.money.charges"}}, "worker may not import money"),
    ({"vpay.base.db": {"vpay.engine.queue"}}, "base may not import engine"),
    ({"vpay.rails.port": {"vpay.money.currency"}}, "port may not import money"),
])
def test_the_rule_catches_an_import_against_the_direction(edge, expected):
    found = violations(edge)
    assert len(found) == 1 and expected in found[0]


def test_the_rule_allows_the_direction():
    assert violations({"vpay.money.charges": {"vpay.rails.port", "vpay.engine.queue", "vpay.base.db"},
                       "vpay.worker.loop": {"vpay.engine.queue"},
                       "vpay.cli.worker": {"vpay.worker.loop", "vpay.money.charges"}}) == []
