"""The import graph of service/: every import counts, at module level, in a function, or under
TYPE_CHECKING, since each is a dependency a reader has to follow.

service/app.py wires the others, so it may import them; none imports it back: each module
that needs something of the server states it as a small Protocol of its own (control's Admin,
routes' ModelView, metrics' MetricsView, binary's BinaryHost, handover's Listeners).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

SERVICE = ROOT / "service"


def imports_of(path: Path, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "service":
                found |= {a.name for a in node.names}
            elif node.module.startswith("service."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("service.")}
    return (found & modules) - {path.stem}


def graph() -> dict[str, set[str]]:
    modules = {p.stem for p in SERVICE.glob("*.py")}
    return {m: imports_of(SERVICE / f"{m}.py", modules) for m in modules}


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
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
    edges = graph()
    assert len(edges) > 20 and edges["app"], edges  # the graph was read
    assert cycles(edges) == []


def test_only_the_entry_points_import_the_app() -> None:
    users = {m for m, deps in graph().items() if "app" in deps}
    assert users <= {"cli", "batch"}, users  # the command line, and batch for resolve_device


def test_lower_layers_never_import_the_service() -> None:
    """workers/ and shm/ sit below service/: an import up would tie a worker to the front-end."""
    service_modules = {p.stem for p in SERVICE.glob("*.py")}
    upward = {
        str(path.relative_to(ROOT)): imports_of(path, service_modules | {"service"})
        for layer in ("workers", "shm")
        for path in (ROOT / layer).glob("*.py")
    }
    assert len(upward) > 10, upward  # the files were read
    assert {name: mods for name, mods in upward.items() if mods} == {}
