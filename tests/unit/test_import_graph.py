"""No circle in the import graph of farm/, registry/ and workers/: every import counts,
the ones inside functions and under ``TYPE_CHECKING`` too, module by module. The import-linter
contracts in pyproject.toml say which way the layers point; this test says that, whatever the
contracts allow, no module reaches itself. A failure prints each circle, shortest first."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

PACKAGES = ("farm", "registry", "workers")
ROOT = Path(__file__).resolve().parents[2]
# Each says what lives in it and what it may import, in its docstring's first lines.
DOCUMENTED = ("farm", "farm/core", "farm/api", "farm/cli", "farm/pipeline", "registry", "registry/store", "workers",
              "workers/qnn", "workers/trt", "migrations", "tests", "infra/devfarm")


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def shortest_circle(graph: Mapping[str, Iterable[str]], start: str) -> list[str]:
    """The shortest path start -> ... -> start (breadth first)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in parent:
                    parent[nxt] = node
                    following.append(nxt)
        frontier = following
    return []


def import_graph() -> dict[str, set[str]]:
    g = grimp.build_graph(*PACKAGES, cache_dir=None)
    return {m: {i for i in g.find_modules_directly_imported_by(m) if i in g.modules} for m in g.modules}


def test_the_finder_finds_a_circle() -> None:
    # The test below asserts an absence: first show that it would see a presence.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert shortest_circle(graph, "a") == ["a", "b", "c", "a"]


def test_no_circle_in_farm_registry_workers() -> None:
    graph = import_graph()
    assert "workers.backends" in graph and "farm.core.errors" in graph, sorted(graph)[:20]
    circles = [shortest_circle(graph, component[0]) for component in strongly_connected(graph)]
    assert not circles, "import circles:\n" + "\n".join(
        " -> ".join(c) + f"   (component of {len(comp)}: {', '.join(comp)})"
        for c, comp in zip(circles, strongly_connected(graph), strict=True))


@pytest.mark.parametrize("package", DOCUMENTED)
def test_each_package_says_what_lives_there_and_what_it_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
    first = doc.split("\n\n", 1)[0]
    assert len(first.splitlines()) >= 3 and "import" in first.lower(), f"{package}/__init__.py: {first!r}"
