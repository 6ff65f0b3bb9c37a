"""The OpenAPI 3.1 document of the HTTP API (`GET /openapi.json`), written from the same route
declarations the router mounts (protocols/endpoint.py; each module's list beside its handlers),
so a route is never served undocumented nor documented unserved.

The schemas are the Structs' (openapi_schemas.py), read from the same limits (Config) and model
facts (labels, dimension, tasks, name); tests/system/test_openapi.py fuzzes a real server from
this document with Schemathesis in both directions: a request the schemas allow is accepted,
one they forbid is refused, and every answer matches its schema. What JSON Schema cannot say (a
list as long as another, a shape that counts the data) is listed per route under
`x-ringserve-400-beyond-schema`: the patterns of the Rules its checks raise.

To add an answer every inference route can give (a 429, say), add it to `ADMITTED`; a header
every inference request may send, to `INFERENCE_HEADERS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from ringserve.service.kserve.documents import VERSION
from ringserve.service.protocols.auth import OPEN_PATH
from ringserve.service.protocols.endpoint import (
    LATENCY,
    TOO_LONG_BODY,
    Answer,
    Endpoint,
    Facts,
    Handler,
    Schema,
    error,
    ok,
)
from ringserve.service.protocols.errors import family
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.openapi_schemas import Schemas, components, referred
from ringserve.service.protocols.routes import Router
from ringserve.service.request.lookup import MODEL_REQUIRED, NEEDS_TASK
from ringserve.service.version import version
from ringserve.service.views import FrontView

OPENAPI = "3.1.0"
STRING: Schema = {"type": "string"}  # a header's or a path parameter's value
HEADERS: dict[str, Schema] = {
    "x-request-id": {"description": "the client's X-Request-Id when it is a sane token, else new"},
    "x-latency-ms": {"description": "ms from the request's last byte to the answer, one decimal"},
    "retry-after": {"description": "seconds to wait before trying again"},
    "www-authenticate": {"description": 'Bearer realm="ringserve"'},
}
INFERENCE_HEADERS: list[Schema] = [
    {
        "name": "X-Request-Timeout-Ms",
        "in": "header",
        "required": False,
        "description": "the request's deadline after its last byte (else --request-timeout-s)",
        "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 86_400_000},
    },
    {
        "name": "X-Priority",
        "in": "header",
        "required": False,
        "description": "lower the request's priority below its key's (never raise it)",
        "schema": {"enum": ["interactive", "bulk"]},
    },
]
MODEL_404 = error('unknown model or version ("model", "version")', *LATENCY)

# Answers any route can give: the connection's limits, before routing.
THROTTLED = "too many failed keys from this client address (--auth-failures)"
EVERY_ROUTE: dict[int, Answer] = {
    400: error(
        "malformed HTTP request, a Host not in --allowed-hosts, or a body or header the route "
        "refuses"
    ),
    403: error("a request from a page on another site (Origin) without a key (--allowed-hosts)"),
    408: error("the request head or body came slower than --read-timeout-s"),
    413: error("body over --max-body bytes"),
    431: error("request head over --max-head bytes"),
    503: error("over --max-connections: this connection is closed", "retry-after"),
}
# Answers every admitted (inference) request can give, beside those above. x-latency-ms is on
# every answer to a request that was read whole; those the connection gives before (malformed
# HTTP, a body over --max-body, --max-connections) have none, hence "?" (optional) there.
ADMITTED: dict[int, Answer] = {
    400: error(
        "wrong schema, invalid UTF-8, an empty text, or a bad X-Request-Timeout-Ms",
        "x-latency-ms?",
    ),
    413: Answer(
        "body over --max-body, or a text over max_length tokens with truncate false (or over "
        "--max-windows windows)",
        TOO_LONG_BODY,
        headers=("x-latency-ms?",),
    ),
    503: error(
        "the queue is full, the server is draining, or no worker can serve",
        "retry-after",
        "x-latency-ms?",
    ),
    504: error("the request's deadline passed first", *LATENCY),
}


# -- the document ---------------------------------------------------------------------------------
class Undocumented(Exception):
    """A route was added to the router without a declaration (Router.add, not Router.mount)."""


def check_covered(registered: list[tuple[str, str]], declared: Sequence[Endpoint]) -> None:
    keys = {e.key for e in declared}
    missing = [f"{m} {p}" for m, p in registered if (m, p) not in keys]
    if missing:
        raise Undocumented(
            "routes added without a declaration (Router.mount): " + ", ".join(missing)
        )


def example_path(template: str, f: Facts) -> bytes:
    return template.replace("{model}", f.model).replace("{version}", f.version).encode()


def answers_of(route: Endpoint, f: Facts) -> dict[int, Answer]:
    """The route's own answers over those any route, admitted request or model path gives."""
    out = dict(EVERY_ROUTE)
    if f.key and not OPEN_PATH.match(example_path(route.path, f)):
        out[401] = error("missing or invalid API key", "www-authenticate")
        out[429] = error(THROTTLED, "retry-after", "x-latency-ms")
    if route.inference:
        out.update(ADMITTED)
        if f.key:  # --api-keys: a key over its rate
            out[429] = error(f"over the key's rate (--api-keys), or {THROTTLED}", "retry-after",
                             "x-latency-ms?")  # fmt: skip
    if route.model_path:
        out[404] = error("unknown model or version", *(LATENCY if route.inference else ()))
    if route.model_body:
        out[404] = MODEL_404
    out.update(route.answers)
    return dict(sorted(out.items()))


def response_doc(answer: Answer, schemas: Schemas, kind: str) -> Schema:
    headers = {"x-request-id": {"required": True, "schema": STRING, **HEADERS["x-request-id"]}}
    for name in answer.headers:
        key = name.rstrip("?")
        headers[key] = {"required": key == name, "schema": STRING, **HEADERS[key]}
    schema = schemas.of(answer.schema, kind)
    content: Schema = {answer.media: {"schema": schema} if schema else {}}
    if answer.binary:
        content["application/octet-stream"] = {
            "schema": {"type": "string", "contentMediaType": "application/octet-stream"}
        }
    return {"description": answer.description, "headers": headers, "content": content}


def path_parameters(route: Endpoint, f: Facts) -> list[Schema]:
    params = []
    if "{model}" in route.path:
        schema = STRING if route.repository_path else {"enum": f.names}
        params.append({"name": "model", "in": "path", "required": True, "schema": schema})
    if "{version}" in route.path:
        params.append(
            {"name": "version", "in": "path", "required": True, "schema": {"enum": [f.version]}}
        )
    if "{region}" in route.path:  # a system shared-memory region's name: any
        params.append({"name": "region", "in": "path", "required": True, "schema": STRING})
    return params


def beyond_schema_of(route: Endpoint, f: Facts) -> list[str]:
    """The patterns of the 400s a schema-valid request to `route` can get from this model."""
    patterns = [NEEDS_TASK.pattern(task=t) for t in route.needs if t not in f.tasks]
    if route.model_body:
        patterns.append(MODEL_REQUIRED.pattern())
    more = route.more_rules(f) if route.more_rules else ()
    return patterns + [rule.pattern() for rule in (*route.rules, *more)]


def operation(route: Endpoint, f: Facts, schemas: Schemas) -> Schema:
    kind = family(route.path.encode())  # OpenAI's, TEI's and Cohere's error shapes
    op: Schema = {
        "summary": route.summary,
        "tags": [route.tag],
        "operationId": (route.method + route.path)
        .lower()
        .replace("/", "_")
        .strip("_")
        .replace("{", "")
        .replace("}", "")
        .replace(".", "_"),
        "responses": {
            str(s): response_doc(a, schemas, kind) for s, a in answers_of(route, f).items()
        },
    }
    if route.description:
        op["description"] = route.description
    params = path_parameters(route, f) + (INFERENCE_HEADERS if route.inference else [])
    if params:
        op["parameters"] = params
    if route.body is not None:
        media: Schema = {"schema": schemas.of(route.body, request=True)}
        if route.examples:
            media["examples"] = {k: {"value": v} for k, v in route.examples.items()}
        content = {"application/json": media}
        op["requestBody"] = {"required": not route.body_optional, "content": content}
    beyond = beyond_schema_of(route, f)
    if beyond:
        op["x-ringserve-400-beyond-schema"] = beyond
    if f.key and not OPEN_PATH.match(example_path(route.path, f)):
        op["security"] = [{"bearer": []}]
    return op


def document(declared: Sequence[Endpoint], f: Facts) -> Schema:
    """The OpenAPI document of these routes, as this server answers them."""
    schemas = Schemas(f)
    paths: dict[str, Schema] = {}
    for route in declared:
        paths.setdefault(route.path, {})[route.method.lower()] = operation(route, f, schemas)
    doc: Schema = {
        "openapi": OPENAPI,
        "info": {
            "title": "ringserve",
            "version": f.server_version,
            "description": 'Every error is {"error": message}, but on OpenAI\'s routes '
            '(/v1/embeddings, /v1/models) {"error": {"message", "type", "param", "code"}}, on '
            'TEI\'s {"error", "error_type"} and on Cohere\'s {"error", "message"}; every '
            "answer carries x-request-id. HEAD is answered for every GET route; any other "
            "method a path does not list is 405 with Allow. See docs/api.md.",
        },
        "paths": dict(sorted(paths.items())),
    }
    used = referred(paths, components(f))
    if used:
        doc["components"] = {"schemas": used}
    if f.key:
        schemes = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc.setdefault("components", {})["securitySchemes"] = schemes
    return doc


def beyond_schema(op: Schema) -> Callable[[str], bool]:
    """Whether a 400 message is one the document lists for this operation (for the fuzzer)."""
    rules = [re.compile(r) for r in op.get("x-ringserve-400-beyond-schema", [])]
    return lambda message: any(r.search(message) for r in rules)


def facts(server: FrontView, key: bool) -> Facts:
    m, s = server.model.manifest, server.settings
    return Facts(
        model=server.model.name,
        labels=list(server.model.labels),
        tasks=list(m.task),
        dimension=m.dimension or int(m.multivector.get("dimension", 0)),
        max_texts=s.max_texts,
        max_documents=s.max_documents,
        max_body=s.max_body,
        version=VERSION,
        server_version=version(),
        key=key,
        models=tuple(sorted({info.name for info in server.models.ready()})),
        activation=m.activation,
    )


def render(router: Router, key: bool) -> bytes:
    """The document of `router`'s routes, as /openapi.json serves it (also on the operator
    port's /docs/openapi.json: service/ops/apidocs.py). It is built per request from the model
    of the time (a reload may change the model's fingerprint; its labels never change)."""
    return json.dumps(document(router.declared, facts(router.server, key))).encode()


def serving(render: Callable[[], bytes]) -> Handler:
    def serve(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, render())

    return serve


ROUTES = [
    Endpoint(
        "GET", "/openapi.json", serving, "This document", "meta", ok("OpenAPI 3.1", "document")
    )
]


def register(router: Router, key: bool) -> None:
    """Serve GET /openapi.json for the routes mounted so far (call it last); a route added
    without a declaration stops the start here."""
    router.mount(ROUTES, lambda: render(router, key))
    check_covered(router.routes, router.declared)
