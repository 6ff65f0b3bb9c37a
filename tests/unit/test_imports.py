"""The import graph of the installed package `ringserve`: every import counts, at module level,
in a function, or under TYPE_CHECKING, since each is a dependency a reader has to follow.

service/app.py wires the others, so it may import them; none imports it back: each module
that needs something of the server states it as a small Protocol of its own (control's Admin,
routes' ModelView, metrics' MetricsView, binary's BinaryHost, handover's Listeners).
"""

from __future__ import annotations

import ast
from pathlib import Path

from devkit.launcher import ROOT

ROOMS = ("service", "workers", "shm", "wire", "factory")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("ringserve", *parts))


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for room in ROOMS for p in (ROOT / room).rglob("*.py")}


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports, by full name (`from a.b import c` counts a.b.c when c
    is a module, else a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m in modules} - {module_name(path)}


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(path, set(modules)) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(part)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_service() -> None:
    edges = {m: deps for m, deps in graph().items() if m.startswith("ringserve.service")}
    assert len(edges) > 20 and edges["ringserve.service.app"], edges  # the graph was read
    assert cycles(edges) == []


def test_only_the_entry_points_import_the_app() -> None:
    users = {m for m, deps in graph().items() if "ringserve.service.app" in deps}
    # the command line, and batch for resolve_device
    assert users <= {"ringserve.service.cli", "ringserve.service.offline.batch"}, users


def test_lower_layers_never_import_the_service() -> None:
    """workers/ and shm/ sit below service/: an import up would tie a worker to the front-end."""
    edges = graph()
    lower = {
        m: deps for m, deps in edges.items() if m.startswith(("ringserve.workers", "ringserve.shm"))
    }
    assert len(lower) > 10, lower  # the files were read
    upward = {
        m: {d for d in deps if d.startswith("ringserve.service")} for m, deps in lower.items()
    }
    assert {m: d for m, d in upward.items() if d} == {}
