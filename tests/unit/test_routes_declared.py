"""Issue 57 item 2: each HTTP route is declared once (protocols/endpoint.py's `Endpoint`, in a
list beside its handlers), and both the router and the OpenAPI document are read from that
declaration; a check beyond the schema is a named `Rule` whose message the check raises and
whose pattern the document lists; no module named *openapi* runs over 300 lines.

The router side is whole by construction: production code adds a route only through
`Router.mount`, which records the declaration it mounts, and the document is written from the
declarations the router holds. These tests hold each link of that chain."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ringserve.service.kserve.documents import VERSION
from ringserve.service.ops import apidocs
from ringserve.service.protocols import openapi, routes, tasks
from ringserve.service.protocols.endpoint import Endpoint, Facts
from ringserve.service.protocols.routes import Router
from ringserve.service.request import lookup
from ringserve.service.request.errors import Rule

from devkit import docgen
from devkit.launcher import ROOT

LIMIT = 300
FOLDERS = ("service", "workers", "shm", "wire", "factory")
FACTS = Facts(
    model="m", labels=["a", "b"], tasks=["classify", "embed"], dimension=8, max_texts=4,
    max_documents=3, max_body=1000, version=VERSION, server_version="0", key=False,
)  # fmt: skip


def production_files() -> list[Path]:
    return [f for folder in FOLDERS for f in sorted((ROOT / folder).rglob("*.py"))]


def test_no_openapi_module_over_300_lines() -> None:
    found = {
        f.relative_to(ROOT).as_posix(): len(f.read_text().splitlines())
        for f in production_files()
        if "openapi" in f.name
    }
    assert "service/protocols/openapi.py" in found  # the rule reads the modules it is about
    assert {path: n for path, n in found.items() if n > LIMIT} == {}


def stub_context() -> Any:
    """What the handler factories are made from (the router's server, the metrics, the /docs
    page): none is called here, so one stand-in with the page's fields serves them all."""
    assets = {name: b"" for name in apidocs.ASSETS}
    return SimpleNamespace(html=b"", api=lambda: b"{}", assets=assets)


def test_router_and_document_come_from_the_same_declarations() -> None:
    """Every declared route mounted: the router serves exactly the document's operations, one
    declaration each, and the document lists exactly the router's routes."""
    every = docgen.every_route()
    router = Router(stub_context())
    router.mount(every)
    assert len({e.key for e in every}) == len(every), "a route declared twice"
    assert router.declared == every and set(router.routes) == {e.key for e in every}
    doc = openapi.document(router.declared, FACTS)
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert documented == set(router.routes)
    router.add("GET", "/v1/undeclared", lambda c, e, p: None)
    with pytest.raises(openapi.Undocumented, match="GET /v1/undeclared"):
        openapi.check_covered(router.routes, router.declared)


def declaring_modules() -> dict[str, list[Endpoint]]:
    """Each production module with a list of declarations (a module-level ROUTES)."""
    out = {}
    for f in (ROOT / "service").rglob("*.py"):
        text = f.read_text()
        if not re.search(r"^ROUTES\b", text, re.M) or f.name.endswith("_pb2.py"):
            continue
        name = "ringserve." + ".".join(f.relative_to(ROOT).with_suffix("").parts)
        out[name] = list(importlib.import_module(name).ROUTES)
    return out


def test_every_declaring_module_is_documented() -> None:
    """docgen.every_route (the reference page, drift) holds every module's declarations."""
    found = declaring_modules()
    assert len(found) >= 10
    every = docgen.every_route()
    for name, declared in found.items():
        assert all(isinstance(e, Endpoint) for e in declared), name
        assert [e for e in declared if e not in every] == [], name


def test_routes_are_added_only_by_mounting_a_declaration() -> None:
    """No production module calls Router.add but Router.mount (routes.py): a route added any
    other way would be served without its declaration (and stop the start)."""
    calls = []
    for f in production_files():
        for node in ast.walk(ast.parse(f.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in ("GET", "POST", "PUT", "DELETE", "HEAD")
            ):
                calls.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert calls == []


def rules_of(module: Any) -> dict[str, Rule]:
    return {name: v for name, v in vars(module).items() if isinstance(v, Rule)}


def protocol_modules() -> list[str]:
    folder = ROOT / "service" / "protocols"
    return sorted(f"ringserve.service.protocols.{f.stem}" for f in folder.glob("*.py"))


@pytest.mark.parametrize("module", protocol_modules())
def test_each_rule_matches_the_message_it_raises(module: str) -> None:
    """A Rule's pattern (what the document lists) matches every message its check can raise."""
    for name, rule in rules_of(importlib.import_module(module)).items():
        if not rule.message:
            continue
        fields = re.findall(r"{(\w+)}", rule.message)
        for value in ("x", "'a b'", "12", ""):
            message = rule.say(**dict.fromkeys(fields, value))
            assert re.search(rule.pattern(), message), (module, name, message)


def test_the_document_lists_a_rule_from_its_constant() -> None:
    """The 400 of a batch whose pairs do not match: raised from routes.PAIRS_UNEVEN, listed from
    it; a task route's rule for a model without the task, from request/lookup.py's NEEDS_TASK."""
    doc = openapi.document(docgen.every_route(), FACTS)
    classify = doc["paths"]["/v1/classify"]["post"]["x-ringserve-400-beyond-schema"]
    assert routes.PAIRS_UNEVEN.pattern() in classify
    rerank = doc["paths"]["/v1/rerank"]["post"]["x-ringserve-400-beyond-schema"]
    assert lookup.NEEDS_TASK.pattern(task="rerank") in rerank
    embeddings = doc["paths"]["/v1/embeddings"]["post"]["x-ringserve-400-beyond-schema"]
    message = tasks.INPUT_COUNT.say(limit=4, n=9)
    assert message == "input must hold 1 to 4 items, not 9"
    assert openapi.beyond_schema({"x-ringserve-400-beyond-schema": embeddings})(message)
