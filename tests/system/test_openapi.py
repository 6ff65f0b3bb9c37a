"""The OpenAPI document (GET /openapi.json) against a real server process: it validates, every
route the server registers is in it, a field the document lacks is caught, and Schemathesis
(`schemathesis run`, its own command line) fuzzes the server from it: every request the
document allows is accepted (or refused only with a 400 the document lists for that route), every
one it forbids is refused, every answer matches its documented status, media type, headers and
schema, no 5xx but a documented 503 or 504, and afterwards the server is healthy.

RINGSERVE_FUZZ_EXAMPLES (as in tests/system/test_fuzz.py) sizes the run: a hundredth of it is the
examples per operation, at least 10 (by default 12; `make fuzz`: 1,000). The coverage phase's
cases (some 3,400: every operation's boundaries) do not depend on it, the fuzzing and stateful
phases' do: at 25 an operation (the floor before) the run took 35 s here, at 12 it takes 19 s.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from openapi_spec_validator import validate
from ringserve.service.config.settings import Config
from ringserve.service.protocols import openapi, routes, schemas

from devkit.openapi_checks import fuzz, summary
from devkit.server import ServerProc, serving, wait_for

INPUTS = int(os.environ.get("RINGSERVE_FUZZ_EXAMPLES", "1200"))
EXAMPLES = max(10, INPUTS // 100)
pytestmark = pytest.mark.timeout(max(300, INPUTS // 50))
REFERENCE = "an honest, moving and beautifully acted film"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    with serving(
        ServerProc(
            tmp_path_factory.mktemp("openapi"),
            ["--workers", "1", "--spares", "0", "--max-body", "65536"],
        ),
        1,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def doc(srv: ServerProc) -> dict[str, Any]:
    status, headers, body = srv.request("GET", "/openapi.json")
    assert status == 200 and headers["content-type"] == "application/json"
    loaded: dict[str, Any] = json.loads(body)
    return loaded


def url(srv: ServerProc, path: str) -> str:
    return f"http://127.0.0.1:{srv.port}{path}"


def test_document_validates(doc: dict[str, Any]) -> None:
    validate(doc)  # openapi-spec-validator: OpenAPI 3.1, its schemas JSON Schema 2020-12
    assert doc["openapi"] == "3.1.0"
    broken = copy.deepcopy(doc)
    broken["paths"]["/v1/model"]["get"]["responses"]["200"]["content"] = "not a map"
    with pytest.raises(Exception, match="not a map"):
        validate(broken)  # the validator can fail: the pass above means something


def test_every_served_route_is_documented(
    srv: ServerProc, doc: dict[str, Any], default_model: str
) -> None:
    """Each documented operation answers (no 404 or 405 for it), and the document names every
    route of the server's router (built here in-process from the same Server class)."""
    name = json.loads(srv.request("GET", "/v1/model")[2])["name"]
    for path, ops in doc["paths"].items():
        concrete = path.replace("{model}", name).replace("{version}", "1")
        for method in ops:
            status, _, _ = srv.request(
                method.upper(), concrete, b"{}" if method == "post" else None
            )
            assert status not in (404, 405), (method, path, status)
    from ringserve.service.app import App

    async def build() -> list[tuple[str, str]]:
        server = App(Config(model=default_model))
        server.prepare()
        return server.inference_router().routes

    routes = asyncio.run(build())
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert set(routes) == documented


def test_a_route_without_a_declaration_fails() -> None:
    """A route added to the router without a declaration (Router.add, not Router.mount) stops
    the start (and this test)."""
    declared = routes.ROUTES[:2]  # POST /v1/classify, GET /v1/model
    openapi.check_covered([("POST", "/v1/classify"), ("GET", "/v1/model")], declared)
    with pytest.raises(openapi.Undocumented, match="GET /v1/undocumented"):
        openapi.check_covered([("POST", "/v1/classify"), ("GET", "/v1/undocumented")], declared)


# -- a planted divergence -------------------------------------------------------------------------
def answer_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema of a GET route's 200 answer, its Struct's component when it refers to one."""
    schema: dict[str, Any] = doc["paths"][path]["get"]["responses"]["200"]["content"]
    schema = schema["application/json"]["schema"]
    ref = schema.get("$ref", "")
    return doc["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


def test_planted_divergence_is_caught(srv: ServerProc, doc: dict[str, Any]) -> None:
    """Schemathesis' own validation of real answers: they pass as they are, and fail with one
    field more (the route answers what the document lacks) or one field less in the document."""
    schema = schemathesis.openapi.from_dict(doc)
    model_op = schema["/v1/model"]["GET"]
    classify_op = schema["/v1/classify"]["POST"]
    model = requests.get(url(srv, "/v1/model"), timeout=30)
    batch = requests.post(url(srv, "/v1/classify"), json={"texts": ["good", "bad"]}, timeout=30)
    assert model_op.is_valid_response(model) and classify_op.is_valid_response(batch)

    answer = model.json()
    model._content = json.dumps({**answer, "planted": 1}).encode()
    assert not model_op.is_valid_response(model)
    results = batch.json()
    results["results"][1]["planted"] = 1  # deep inside a batch's second result
    batch._content = json.dumps(results).encode()
    assert not classify_op.is_valid_response(batch)

    model._content = json.dumps(answer).encode()
    lacking = copy.deepcopy(doc)
    body = answer_schema(lacking, "/v1/model")
    del body["properties"]["runtime"]
    body["required"].remove("runtime")
    assert not schemathesis.openapi.from_dict(lacking)["/v1/model"]["GET"].is_valid_response(model)


def test_planted_divergence_fails_the_fuzzer(
    srv: ServerProc, doc: dict[str, Any], tmp_path: Path
) -> None:
    """The same run as test_schemathesis_from_the_document, from a document that lacks one field
    /v1/model answers: it fails, naming the schema check."""
    lacking = copy.deepcopy(doc)
    body = answer_schema(lacking, "/v1/model")
    del body["properties"]["runtime"]
    body["required"].remove("runtime")
    path = tmp_path / "lacking.json"
    path.write_text(json.dumps(lacking))
    base = url(srv, "")
    run = fuzz(str(path), 3, tmp_path, "--url", base, "--include-path", "/v1/model")
    assert run.returncode != 0 and "runtime" in run.stdout, run.stdout[-3000:]
    assert "Response violates schema" in run.stdout, run.stdout[-3000:]
    path.write_text(json.dumps(doc))  # and the true document passes the same run
    assert (
        fuzz(str(path), 3, tmp_path, "--url", base, "--include-path", "/v1/model").returncode == 0
    )


# -- what the fuzzer found ------------------------------------------------------------------------
def test_refusals_of_inference_routes_carry_latency(srv: ServerProc) -> None:
    """The contract's x-latency-ms on every inference answer: /v1 and the task routes' 400s
    lacked it (KServe's had it)."""
    for path in ("/v1/classify", "/v1/embeddings", "/embed", "/rerank", "/v1/rerank"):
        status, headers, body = srv.request("POST", path, {"nothing": 1})
        assert status == 400 and "x-latency-ms" in headers, (path, headers, body)


def test_integral_numbers_are_integers(srv: ServerProc) -> None:
    """JSON Schema's integer (the document's) includes 384.0; the server refused it."""
    ok = srv.request("POST", "/v1/embeddings", {"input": "a film", "dimensions": 8.0})
    assert ok[0] == 200 and len(json.loads(ok[2])["data"][0]["embedding"]) == 8
    infer = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1.0], "data": ["a"]}]}
    assert srv.request("POST", "/v2/models/sst2-minilm/infer", infer)[0] == 200
    assert srv.request("POST", "/v1/embeddings", {"input": "a", "dimensions": 8.5})[0] == 400


def test_kserve_parameters_are_checked(srv: ServerProc) -> None:
    """A bad `timeout` was ignored when X-Request-Timeout-Ms was sent, and any value was taken
    as binary_data_output; `model` of any type was taken by the OpenAI and Cohere routes."""
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]
    path = "/v2/models/sst2-minilm/infer"
    header = {"X-Request-Timeout-Ms": "5000"}
    for params in ({"timeout": "soon"}, {"timeout": 10**30}, {"binary_data_output": "yes"}):
        status, _, body = srv.request(
            "POST", path, {"inputs": inputs, "parameters": params}, header
        )
        assert status == 400, (params, body)
    outputs = [{"name": "scores", "parameters": {"binary_data": 1}}]
    assert srv.request("POST", path, {"inputs": inputs, "outputs": outputs})[0] == 400
    assert srv.request("POST", "/v1/embeddings", {"input": "a", "model": 3})[0] == 400
    assert srv.request("POST", "/v1/embeddings", {"input": "a", "model": "any"})[0] == 200


def test_blank_as_the_server_counts_it() -> None:
    """A text's "not only whitespace" is spelled out in the pattern as str.strip() counts it:
    U+001C and U+0085 are blank to the server (a pattern's \\s would let them through) and
    U+FEFF is not (\\s would refuse it)."""
    import re

    pattern = re.compile(schemas.NOT_BLANK)
    for text in ["\x1c", "\x85", " \u3000\t", "\ufeff", "a", " b ", "\u2028x"]:
        assert bool(pattern.search(text)) == bool(text.strip()), repr(text)


def test_null_is_as_if_left_out(srv: ServerProc) -> None:
    """The document's nullable fields: the server reads them with dict.get."""
    bodies = {
        "/v1/classify": {"text": "a", "truncate": None, "truncation_direction": None},
        "/v1/embeddings": {"input": "a", "dimensions": None},
        "/v2/models/sst2-minilm/infer": {
            "id": None, "parameters": {"timeout": None}, "outputs": None,
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"],
                        "parameters": None}],
        },
    }  # fmt: skip
    for path, body in bodies.items():
        assert srv.request("POST", path, body)[0] == 200, path


# -- the fuzzer -----------------------------------------------------------------------------------
def test_schemathesis_from_the_document(srv: ServerProc, tmp_path: Path) -> None:
    """`schemathesis run` from the served document: every built-in check but two, which
    devkit/openapi_checks.py replaces with the document's own exceptions."""
    run = fuzz(url(srv, "/openapi.json"), EXAMPLES, tmp_path)
    print(f"\nschemathesis, {EXAMPLES} examples an operation:\n{summary(run)[-1500:]}")
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
    assert "generated" in summary(run) and " passed" in summary(run)
    pids = srv.worker_pids()
    wait_for(lambda: srv.request("GET", "/v2/health/ready")[0] == 200, 30, "ready after")
    assert srv.classify(REFERENCE)["label"] in ("positive", "negative")
    assert srv.status()["restarts_total"] == 0 and srv.worker_pids() == pids
    assert "Traceback" not in srv.logs(), srv.logs()[-3000:]
