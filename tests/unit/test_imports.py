"""The import graph of the installed package `ringserve`, and the rules it keeps: every import
counts, at module level, in a function, or under TYPE_CHECKING, since each is a dependency a
reader has to follow; a rule about the worker's start-up counts only module-level imports.

service/app.py wires the others, so it may import them; none imports it back: each module
that needs something of the server states it as a small Protocol (control's Admin, handover's
Listeners; service/views.py's FrontView, what every protocol reads of Front, and
service/ops/views.py's MetricsView).

No two sibling folders import each other: at any depth under the rooms, an import runs one way
between the folders of one package (service/ops/ reads service/protocols/, never the reverse),
so that either can be read without the other's inside. What both need sits lower, or is a
Protocol on the side that reads.

The rules are pure functions over a graph, so each is tested on a planted violation as well as
on the real tree.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path

from devkit.launcher import ROOT

ROOMS = ("service", "workers", "shm", "wire", "factory")
# Not installed: test scaffolding, tests and benchmarks. Read for the bare-import rule only.
SCAFFOLDING = ("devkit", "benchmarks", "tests")
APP = "ringserve.service.app"
HTTP = "ringserve.service.protocols.http"  # the HTTP/1.1 protocol module
REQUEST, KSERVE = "ringserve.service.request", "ringserve.service.kserve"
# Who may import the app: the command line, and nobody else.
APP_USERS = {"ringserve.service.cli"}

# module -> {(imported name, at module level)}; names as written, resolved to a module of the
# tree where one is named (`from a.b import c` counts a.b.c when c is a module, else a.b).
Graph = dict[str, set[tuple[str, bool]]]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    installed = parts[0] in ROOMS
    return ".".join(("ringserve", *parts) if installed else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for room in ROOMS for p in (ROOT / room).rglob("*.py")}


def scaffolding_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for room in SCAFFOLDING
        if (ROOT / room).is_dir()
        for p in (ROOT / room).rglob("*.py")
    }


def top_level_imports(tree: ast.Module) -> set[ast.AST]:
    """The import statements that run when the module is imported (not inside a function)."""
    found: set[ast.AST] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.add(node)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return found


def programs_in(tree: ast.Module) -> list[ast.Module]:
    """The Python programs held in string constants (the `python -c` code a test runs)."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "import" in node.value
        ):
            try:
                found.append(ast.parse(node.value))
            except (SyntaxError, ValueError):  # prose, or a fragment: not a program
                continue
    return found


def edges_of(path: Path, modules: set[str]) -> set[tuple[str, bool]]:
    """Every name `path` imports, with whether the import runs at module level; a program in a
    string counts as imported in a function (it runs in another process, if at all)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = top_level_imports(tree)
    found: set[tuple[str, bool]] = set()
    for node in (n for t in (tree, *programs_in(tree)) for n in ast.walk(t)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add((sub if sub in modules else node.module, node in top))
        elif isinstance(node, ast.Import):
            found |= {(a.name, node in top) for a in node.names}
    return found


@functools.cache
def read_graph() -> Graph:
    modules = {**all_modules(), **scaffolding_modules()}
    known = set(modules)
    return {name: edges_of(path, known) for name, path in modules.items()}


def full_graph() -> Graph:
    """The installed modules and the scaffolding, with every name they import (read once)."""
    return {m: set(ds) for m, ds in read_graph().items()}


def graph() -> dict[str, set[str]]:
    """The installed modules and the project modules each imports."""
    modules = all_modules()
    full = full_graph()
    return {m: {d for d, _ in full[m] if d in modules} - {m} for m in modules}


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


# -- the rules: each gives the (importer, imported) pairs that break it ---------------------------
def within(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def crossing(
    g: Graph, importers: tuple[str, ...], imported: tuple[str, ...], top_only: bool = False
) -> set[tuple[str, str]]:
    """The imports from a module of `importers` of a module of `imported` (packages or modules;
    an empty `importers` means any module)."""
    return {
        (m, d)
        for m, ds in g.items()
        if not importers or within(m, *importers)
        for d, top in ds
        if (top or not top_only) and within(d, *imported)
    }


def app_importers(g: Graph) -> set[tuple[str, str]]:
    """No installed module imports the app but the command line (tests may: they test it)."""
    return {(m, d) for m, d in crossing(g, ("ringserve",), (APP,)) if m not in APP_USERS}


def lower_imports_service(g: Graph) -> set[tuple[str, str]]:
    """workers/ and shm/ sit below service/: an import up would tie a worker to the front-end;
    shm/ sits below workers/ too."""
    lower = ("ringserve.workers", "ringserve.shm")
    return crossing(g, lower, ("ringserve.service",)) | crossing(
        g, ("ringserve.shm",), ("ringserve.workers", "ringserve.factory")
    )


def wire_imports_server(g: Graph) -> set[tuple[str, str]]:
    """wire/ (frames and the client) is shared by the server, the client and the corpus: it
    imports nothing of the server or the worker."""
    server = ("ringserve.service", "ringserve.workers", "ringserve.factory")
    return crossing(g, ("ringserve.wire",), server)


def worker_loads_factory(g: Graph) -> set[tuple[str, str]]:
    """A worker only reads artifacts: building them (torch, ONNX export) is imported, if ever,
    inside the function that needs it, never when the worker starts."""
    return crossing(g, ("ringserve.workers",), ("ringserve.factory",), top_only=True)


def engine_imports_pool(g: Graph) -> set[tuple[str, str]]:
    """The engine owns the request channel (engine.link.WorkerLink); the pool owns the process
    and tells the engine what changed through calls: the engine imports nothing of the pool."""
    return crossing(g, ("ringserve.service.engine",), ("ringserve.service.pool",))


def rpc_imports_http(g: Graph) -> set[tuple[str, str]]:
    """gRPC is a transport beside HTTP/1.1, not on top of it: what both need (the error type,
    KServe's semantics) lives in service/request/ and service/kserve/, never in http.py."""
    return crossing(g, ("ringserve.service.protocols.rpc",), (HTTP,))


def request_layer_imports_transport(g: Graph) -> set[tuple[str, str]]:
    """service/request/ (the error type and the checks every route shares) and service/kserve/
    (KServe's semantics) sit below the transports that use them: neither imports anything of
    service/protocols/, and request/ nothing of kserve/ (no two sibling folders both ways)."""
    return crossing(g, (REQUEST, KSERVE), ("ringserve.service.protocols",)) | crossing(
        g, (REQUEST,), (KSERVE,)
    )


def installed_imports_scaffolding(g: Graph) -> set[tuple[str, str]]:
    """devkit, benchmarks and tests are not installed: no installed module may import them."""
    return crossing(g, ("ringserve",), SCAFFOLDING)


def bare_imports(g: Graph) -> set[tuple[str, str]]:
    """The rooms are installed as ringserve.<room>: a bare `service` (`workers`, ...) would
    find nothing in a wheel, or someone else's package of that name."""
    return crossing(g, (), ROOMS)


def imports_between_tests(g: Graph) -> set[tuple[str, str]]:
    """What two test modules share lives in devkit/: no test module imports another."""
    return {
        (m, d)
        for m, ds in g.items()
        if within(m, "tests")
        for d, _ in ds
        if within(d, "tests") and d.rsplit(".", 1)[-1].startswith("test_")
    }


def siblings(importer: str, imported: str) -> tuple[str, str] | None:
    """The two entries of one package an import crosses: the children of the deepest package
    both names sit in (None when one name holds the other)."""
    a, b = importer.split("."), imported.split(".")
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    if n in (len(a), len(b)):
        return None
    return ".".join(a[: n + 1]), ".".join(b[: n + 1])


def folders_of(g: Graph) -> set[str]:
    """Every package a name of the graph sits in."""
    names = set(g) | {d for ds in g.values() for d, _ in ds}
    return {
        ".".join(parts[:i]) for m in names for parts in [m.split(".")] for i in range(1, len(parts))
    }


def sibling_ties(g: Graph) -> set[tuple[str, str]]:
    """Two sibling folders under the rooms that import each other, every import counted (a
    module beside a folder counts with it: service/views.py beside service/protocols/); each
    pair in name order. Two modules of one folder are not this rule's (service/'s are the cycle
    test's)."""
    folders = folders_of(g)
    crossed = {
        pair
        for m, ds in g.items()
        if within(m, "ringserve")
        for d, _ in ds
        if within(d, "ringserve") and (pair := siblings(m, d)) and set(pair) & folders
    }
    return {(a, b) for a, b in crossed if a < b and (b, a) in crossed}


RULES: dict[str, Callable[[Graph], set[tuple[str, str]]]] = {
    "app": app_importers,
    "lower": lower_imports_service,
    "wire": wire_imports_server,
    "factory": worker_loads_factory,
    "engine": engine_imports_pool,
    "rpc": rpc_imports_http,
    "request": request_layer_imports_transport,
    "scaffolding": installed_imports_scaffolding,
    "bare": bare_imports,
    "tests": imports_between_tests,
}

# A small tree that keeps every rule, and for each rule one import that breaks it.
PLANTED_OK: Graph = {
    "ringserve.service.cli": {(APP, True)},
    APP: {("ringserve.service.ops.metrics", True), ("ringserve.workers.spec", True)},
    "ringserve.service.ops.metrics": {("ringserve.wire.frames", True)},
    "ringserve.workers.artifact": {("ringserve.factory.model", False), ("ringserve.shm", True)},
    "ringserve.shm.ring": {("os", True)},
    "ringserve.wire.client": {("ringserve.wire.frames", True)},
    "tests.unit.test_x": {("devkit.launch", True), ("ringserve.service.app", True)},
    "benchmarks.b": {("devkit.load", True)},
    "ringserve.service.pool.handle": {("ringserve.service.engine.link", True)},
    "ringserve.service.protocols.rpc.infer": {("ringserve.service.kserve.reading", True)},
    "ringserve.service.kserve.reading": {("ringserve.service.request.errors", True)},
}
PLANTED: dict[str, tuple[str, tuple[str, bool]]] = {
    "app": ("ringserve.service.protocols.routes", (APP, False)),
    "lower": ("ringserve.workers.process.worker", ("ringserve.service.logs", False)),
    "wire": ("ringserve.wire.client", ("ringserve.service.config.settings", True)),
    "factory": ("ringserve.workers.process.worker", ("ringserve.factory.model", True)),
    "engine": ("ringserve.service.engine.routing", ("ringserve.service.pool.handle", False)),
    "rpc": ("ringserve.service.protocols.rpc.servicer", (HTTP, False)),
    "request": ("ringserve.service.kserve.reading", ("ringserve.service.protocols.routes", False)),
    "scaffolding": ("ringserve.service.offline.batch", ("devkit.launch", False)),
    "bare": ("tests.unit.test_x", ("service.app", True)),
    "tests": ("tests.system.test_y", ("tests.unit.test_x", True)),
}


# The four ties issue 57 cut, each kept one way (SIBLINGS_OK) and planted back the other way:
# the import that made the pair two-way, whether at module level, under TYPE_CHECKING (which
# the graph counts as module level) or in a function.
SIBLINGS_OK: Graph = {
    "ringserve.service.models.info": {("ringserve.factory.build", True)},
    "ringserve.service.ops.metrics": {("ringserve.service.protocols.routes", True)},
    "ringserve.service.protocols.routes": {("ringserve.service.views", True)},
    "ringserve.workers.process.served": {("ringserve.workers.runtimes.cpu", True)},
    # two modules of one folder: a cycle, not a tie of siblings
    "ringserve.factory.build": {("ringserve.factory.sparse", False)},
    "ringserve.factory.sparse": {("ringserve.factory.build", False)},
}
SIBLINGS_PLANTED: dict[tuple[str, str], tuple[str, tuple[str, bool]]] = {
    ("ringserve.factory", "ringserve.service"): (
        "ringserve.factory.build",
        ("ringserve.service.models.precision", True),
    ),
    ("ringserve.service.ops", "ringserve.service.protocols"): (
        "ringserve.service.protocols.admit",
        ("ringserve.service.ops.tracing", True),
    ),
    ("ringserve.service.protocols", "ringserve.service.views"): (
        "ringserve.service.views",
        ("ringserve.service.protocols.http", True),
    ),
    ("ringserve.workers.process", "ringserve.workers.runtimes"): (
        "ringserve.workers.runtimes.cuda",
        ("ringserve.workers.process.batcher", False),
    ),
}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_service() -> None:
    edges = {m: deps for m, deps in graph().items() if m.startswith("ringserve.service")}
    assert len(edges) > 20 and edges["ringserve.service.app"], edges  # the graph was read
    assert cycles(edges) == []


def test_only_the_entry_points_import_the_app() -> None:
    users = {m for m, deps in graph().items() if APP in deps}
    # the command line only (see APP_USERS)
    assert users <= APP_USERS, users
    assert app_importers(full_graph()) == set()


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
    assert lower_imports_service(full_graph()) == set()


def test_the_real_tree_keeps_every_rule() -> None:
    g = full_graph()
    assert len([m for m in g if m.startswith("tests.")]) > 10, sorted(g)  # the tests were read
    assert any(("ringserve.factory.model", False) in ds for ds in g.values())  # kinds were told
    assert {name: found for name, rule in RULES.items() if (found := rule(g))} == {}


def test_each_rule_fails_on_a_planted_violation() -> None:
    assert set(PLANTED) == set(RULES)
    assert {name: found for name, rule in RULES.items() if (found := rule(PLANTED_OK))} == {}
    for name, (importer, edge) in PLANTED.items():
        planted = {m: set(ds) for m, ds in PLANTED_OK.items()}
        planted.setdefault(importer, set()).add(edge)
        broken = {other: rule(planted) for other, rule in RULES.items()}
        assert broken[name] == {(importer, edge[0])}, (name, broken)
        assert all(not v for other, v in broken.items() if other != name), (name, broken)


def test_no_two_sibling_folders_import_each_other() -> None:
    g = full_graph()
    infer, views = "ringserve.service.protocols.rpc.infer", "ringserve.service.views"
    assert siblings(infer, views) == ("ringserve.service.protocols", views)
    assert siblings("ringserve.service.ops", "ringserve.service.ops.stats") is None
    assert sibling_ties(g) == set()


def test_each_sibling_tie_fails_on_a_planted_violation() -> None:
    assert sibling_ties(SIBLINGS_OK) == set()
    for pair, (importer, edge) in SIBLINGS_PLANTED.items():
        planted = {m: set(ds) for m, ds in SIBLINGS_OK.items()}
        planted.setdefault(importer, set()).add(edge)
        assert sibling_ties(planted) == {pair}, (pair, sibling_ties(planted))


def test_a_function_level_import_is_told_from_a_module_level_one(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import a\nif True:\n    from b import c\ntry:\n    import d\nexcept ImportError:\n"
        "    pass\nclass K:\n    import e\n    def f(self):\n        import g\n"
        "def h():\n    from i import j\n"
        "run(['python', '-c', 'from k import l; print(l)'])\n",
        encoding="utf-8",
    )
    assert edges_of(source, set()) == {
        ("a", True),
        ("b", True),
        ("d", True),
        ("e", True),
        ("g", False),
        ("i", False),
        ("k", False),
    }
