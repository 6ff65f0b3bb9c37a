"""HTTP routes: our JSON API (/v1) and health, declared in `ROUTES`; the router that mounts every
module's declarations (protocols/endpoint.py), and the checks the other routes share."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote

import msgspec
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols import admit
from ringserve.service.protocols.admit import RETRY_AFTER, latency_header
from ringserve.service.protocols.endpoint import (
    LATENCY,
    Answer,
    Endpoint,
    Handler,
    Schema,
    SchemaOf,
    ok,
)
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.schemas import UNSET, decode
from ringserve.service.protocols.schemas import server as bodies
from ringserve.service.protocols.schemas.operator import Live, Ready
from ringserve.service.protocols.schemas.v1 import (
    ONE_OR_MANY,
    Classify,
    ClassifyBatch,
    ClassifyResult,
    ModelCard,
    ModelEntry,
    ModelList,
    ModelRow,
    NamedModelCard,
)
from ringserve.service.request import prompts
from ringserve.service.request.errors import RequestError, Rule, Rules
from ringserve.service.request.lookup import find_model, needs_task, request_model
from ringserve.service.views import FrontView
from ringserve.shm import layout as L
from ringserve.workers.artifact import MANIFEST_FILE

# The 400s beyond a body's schema that every route naming a model can give (the document lists
# them: protocols/openapi.py): a model without the route's task, no "model" among several.
PAIRS_UNEVEN = Rule("text_pairs must be a list as long as texts")


def long_text_fields(r: Result) -> dict[str, Any]:
    """What an answer says about a text that was cut or windowed (nothing otherwise)."""
    if r.flags & L.RSP_TRUNCATED:
        return {"truncated": True, "tokens": r.tokens}
    if r.flags & L.RSP_WINDOWED:
        return {"windows": r.windows, "tokens": r.tokens}
    return {}


def classify_result(labels: list[str], r: Result) -> ClassifyResult:
    """One text's answer, as its Struct (schemas/v1.py) writes it."""
    out = ClassifyResult(label=labels[r.label_id], label_id=r.label_id, scores=r.scores.tolist())  # type: ignore[union-attr]
    if r.flags & L.RSP_TRUNCATED:
        out.truncated, out.tokens = True, r.tokens
    elif r.flags & L.RSP_WINDOWED:
        out.windows, out.tokens = r.windows, r.tokens
    if r.flags & L.RSP_SECOND_LOOK:
        out.precision = "fp32"
    elif r.flags & L.RSP_INT8:
        out.precision = "int8"
    return out


def classify(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    body = decode(ex, bodies.of(server.settings).classify)
    info = request_model(server, body)
    needs_task(info, "classify")
    labels = info.labels
    texts, single = classify_texts(body)
    ask = Ask(texts, body.options(), "classify", info.index)

    def done(results: list[Result]) -> None:
        items = [classify_result(labels, r) for r in results]
        answer = msgspec.json.encode(items[0] if single else ClassifyBatch(items))
        conn.respond(ex, 200, answer, extra=[latency_header(conn, ex)])

    admit.submit(server.admission, conn, ex, ask, done)


def classify_texts(body: Classify) -> tuple[list[bytes], bool]:
    """(the payloads, whether it is one text): what the Struct cannot say is checked here."""
    if isinstance(body.text, str) and body.texts is UNSET:
        if body.text_pairs is not UNSET:
            raise RequestError(400, '"text_pairs" goes with "texts"; use "text_pair" with "text"')
        texts = [body.text.encode()]
        if isinstance(body.text_pair, str):
            return [texts[0] + L.PAIR_SEPARATOR + body.text_pair.encode()], True
        return texts, True
    if isinstance(body.texts, list) and body.text is UNSET:
        if body.text_pair is not UNSET:
            raise RequestError(400, '"text_pair" goes with "text"; use "text_pairs" with "texts"')
        texts = [t.encode() for t in body.texts]
        if isinstance(body.text_pairs, list):
            if len(body.text_pairs) != len(texts):
                raise RequestError(400, PAIRS_UNEVEN.say())
            texts = [
                t + L.PAIR_SEPARATOR + p.encode()
                for t, p in zip(texts, body.text_pairs, strict=True)
            ]
        return texts, False
    raise RequestError(400, 'body must have exactly one of "text" or "texts"')


def model_info(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    conn.respond(ex, 200, msgspec.json.encode(model_card(server, server.model)))


def named_model(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    """GET /v1/models/{model}: what /v1/model gives, for the version that serves that name."""
    info = find_model(server, unquote(params["model"]))
    card = msgspec.structs.asdict(model_card(server, info))
    named = NamedModelCard(**openai_model(info), **card)
    conn.respond(ex, 200, msgspec.json.encode(named))


def list_models(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    """GET /v1/models: every model the server holds, with its state; in OpenAI's list shape
    (`data`) and, as before, under `models`."""
    infos = {(e.info.name, str(e.info.version)): e.info for e in server.models}
    rows, data = [], []
    for row in server.models.listing():
        info = infos[str(row["name"]), str(row["version"])]
        fields: dict[str, Any] = {k: row[k] for k in ("name", "state", "task", "labels")}
        fields |= {"version": str(row["version"]), **prompts.listing(info.manifest)}
        rows.append(ModelRow(**fields))
        data.append(ModelEntry(**openai_model(info), **fields))
    answer = ModelList(object="list", data=data, models=rows)
    conn.respond(ex, 200, msgspec.json.encode(answer))


def openai_model(info: ModelInfo) -> dict[str, Any]:
    """OpenAI's fields of a model object. `created` is when the artifact was written (its
    manifest's modification time, Unix seconds), the nearest thing to OpenAI's meaning."""
    try:
        created = int(os.stat(os.path.join(info.model_dir, MANIFEST_FILE)).st_mtime)
    except OSError:
        created = 0
    return {"id": info.name, "object": "model", "created": created, "owned_by": "ringserve"}


def model_card(server: FrontView, info: ModelInfo) -> ModelCard:
    """What GET /v1/model says of a model (schemas/v1.py's ModelCard)."""
    m = info.manifest
    body: dict[str, Any] = {
        "name": info.name,
        "labels": m.labels,
        "max_length": m.max_length,
        "fingerprint": m.fingerprint,
        "activation": m.activation,
        "architecture": m.extra.get("architecture", "sentence-transformers"),
        "device": info.device,
        "buckets": list(info.pad_grid),
        "length_classes": list(info.buckets),
        "runtime": info.runtime,
        "precision": server.settings.for_model(info.name).precision,
        "task": m.task,
        "dimension": m.dimension or int(m.multivector.get("dimension", 0)),  # ColBERT's: a token's
    }
    body |= prompts.listing(m)  # sentence-transformers' prompts, for prompt_name
    if info.precision_chosen_by:  # --precision auto: what it resolved to, and why
        body["precision_chosen_by"] = info.precision_chosen_by
    if info.graph:  # ONNX Runtime at fp32: which graph serves, and the timings that chose it
        body["graph"] = info.graph
    precision = server.settings.for_model(info.name).precision
    if precision == "int8" and info.runtime == "onnx":
        body["int8"] = m.int8  # the cost measured when the artifact was built
    if precision == "int8-checked" and info.runtime == "onnx":
        body["int8_checked"] = m.int8_checked
    if precision == "bf16" and info.runtime == "openvino" and m.bf16:
        body["bf16"] = m.bf16  # the same, by a building CPU that had bf16
    compact = m.extra.get("compact")
    if isinstance(compact, dict):  # the ranges themselves stay in the manifest
        calibration = {k: v for k, v in compact["calibration"].items() if k in ("texts", "source")}
        body["compact"] = {"recall_at_10": compact["recall_at_10"], "calibration": calibration}
    return ModelCard(**body)


# The probes' answers, written once from their Structs (schemas/operator.py)
LIVE = msgspec.json.encode(Live(True))
READY, NOT_READY = msgspec.json.encode(Ready(True)), msgspec.json.encode(Ready(False))


def health_live(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    conn.respond(ex, 200, LIVE)


def health_ready(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    if server.ready():
        conn.respond(ex, 200, READY)
    else:
        conn.respond(ex, 503, NOT_READY, extra=RETRY_AFTER)


SEEN_PATHS = 256  # pattern paths the router remembers (Router.seen)


class Router:
    """Exact paths and `{name}` patterns, each with the methods it allows."""

    def __init__(self, server: FrontView) -> None:
        self.server = server
        self.exact: dict[bytes, dict[bytes, Handler]] = {}
        self.patterns: list[tuple[list[str], dict[bytes, Handler]]] = []
        self.routes: list[tuple[str, str]] = []  # (method, path) as added
        self.declared: list[Endpoint] = []  # the declarations mounted: what openapi documents
        # Paths matched lately (a pattern's: the same few model paths, request after request),
        # so a request skips the scan of every pattern; bounded, and emptied by add().
        self.seen: dict[bytes, tuple[dict[bytes, Handler], dict[str, str]] | None] = {}

    def mount(self, endpoints: Iterable[Endpoint], context: Any = None) -> None:
        """Serve each declared route with the handler its declaration makes from `context` (the
        router's server unless given)."""
        for e in endpoints:
            self.add(e.method, e.path, e.handler(self.server if context is None else context))
            self.declared.append(e)

    def add(self, method: str, path: str, handler: Handler) -> None:
        """Serve one route (undeclared: openapi.register refuses to start with one)."""
        self.seen.clear()
        if (method, path) not in self.routes:
            self.routes.append((method, path))
        if "{" in path:
            parts = path.strip("/").split("/")
            for p, table in self.patterns:
                if p == parts:
                    table[method.encode()] = handler
                    return
            self.patterns.append((parts, {method.encode(): handler}))
        else:
            self.exact.setdefault(path.encode(), {})[method.encode()] = handler

    def match(self, path: bytes) -> tuple[dict[bytes, Handler], dict[str, str]] | None:
        """The path's methods and its pattern's values (a copy the handler may keep)."""
        table = self.exact.get(path)
        if table is not None:
            return table, {}
        if path in self.seen:
            found = self.seen[path]
            return None if found is None else (found[0], dict(found[1]))
        found = self.scan(path)
        if len(self.seen) >= SEEN_PATHS:  # bounded: a client's every path is not kept
            self.seen.clear()
        self.seen[path] = found
        return None if found is None else (found[0], dict(found[1]))

    def scan(self, path: bytes) -> tuple[dict[bytes, Handler], dict[str, str]] | None:
        try:
            parts = path.decode("utf-8").strip("/").split("/")
        except UnicodeDecodeError:
            return None
        for pattern, table in self.patterns:
            if len(pattern) != len(parts):
                continue
            params: dict[str, str] = {}
            for want, got in zip(pattern, parts, strict=True):
                if want.startswith("{"):
                    if not got:
                        break
                    params[want[1:-1]] = got
                elif want != got:
                    break
            else:
                return table, params
        return None

    def __call__(self, conn: HttpProtocol, ex: Exchange) -> None:
        path = ex.url.split(b"?", 1)[0]
        found = self.match(path)
        if found is None:
            raise RequestError(404, f"no such path: {path.decode('utf-8', 'replace')[:200]}")
        table, params = found
        handler = table.get(ex.method)
        if handler is None and ex.method == b"HEAD":
            handler = table.get(b"GET")
        if handler is None:
            allowed = b", ".join(sorted(table))
            conn.respond_error(
                ex, 405, f"method {ex.method.decode()} not allowed", [(b"allow", allowed)]
            )
            return
        handler(conn, ex, params)


ViewHandler = Callable[[FrontView, HttpProtocol, Exchange, dict[str, str]], None]


def inference(server: FrontView, handler: ViewHandler) -> Handler:
    """An inference route: its refusals carry x-latency-ms, as every inference answer does
    (the contract; the OpenAPI fuzzer found 400s of /v1 without it)."""

    def run(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        try:
            handler(server, conn, ex, params)
        except RequestError as exc:
            conn.respond_error(ex, exc.status, exc.message, [latency_header(conn, ex)])

    return run


def viewed(handler: ViewHandler) -> Callable[[FrontView], Handler]:
    """A declaration's handler that reads the server (the mount's context)."""
    return lambda server: lambda c, e, p: handler(server, c, e, p)


def inferred(handler: ViewHandler) -> Callable[[FrontView], Handler]:
    """A declaration's inference handler: its refusals carry x-latency-ms (`inference`)."""
    return lambda server: inference(server, handler)


def task_route(
    path: str,
    handler: ViewHandler,
    summary: str,
    task: str,
    answer: tuple[str, SchemaOf, SchemaOf],
    example: Schema,
    rules: Rules = (),
) -> Endpoint:
    """An inference route of one task (its tag): JSON in, JSON out, a "model" in the body, and
    400 for a model without the task. `answer`: (description, request body, answer)."""
    description, request, response = answer
    return Endpoint(
        "POST", path, inferred(handler), summary, task,
        ok(description, response, "application/json", *LATENCY), request,
        inference=True, model_body=True, needs=(task,), rules=rules, examples={"one": example},
    )  # fmt: skip


def being(schema: Schema, field: str, value: Any) -> Schema:
    """`schema` with one field's value fixed (a probe's `ready` true with 200, false with 503)."""
    return {"allOf": [schema, {"properties": {field: {"const": value}}}]}


ROUTES = [
    Endpoint(
        "POST", "/v1/classify", inferred(classify), "Classify a text, a pair, or a batch", "v1",
        ok("scores in label order",
           lambda d: {"oneOf": [d.answer("classify"), d.answer("classify_batch")]},
           "application/json", *LATENCY),
        lambda d: {"allOf": [d.body("classify"), ONE_OR_MANY]},
        inference=True, model_body=True, needs=("classify",), rules=(PAIRS_UNEVEN,),
        examples={"one": {"text": "a fine film"}, "batch": {"texts": ["good", "bad"]}},
    ),
    Endpoint("GET", "/v1/model", viewed(model_info), "The served model (the first, with many)",
             "v1", ok("the model", "model")),
    Endpoint("GET", "/v1/models", viewed(list_models),
             "Every model the server holds, with its state", "v1", ok("the models", "models")),
    Endpoint("GET", "/v1/models/{model}", viewed(named_model),
             "One loaded model, as /v1/model gives it, with OpenAI's fields", "v1",
             ok("the model", "named_model"), model_path=True),
    Endpoint("GET", "/v2/health/live", viewed(health_live), "Liveness", "health",
             ok("live", "live")),
    Endpoint(
        "GET", "/v2/health/ready", viewed(health_ready),
        "Readiness: a worker is ready and the server is not stopping", "health",
        {**ok("ready", lambda d: being(d.answer("ready"), "ready", True)),
         503: Answer("not ready", lambda d: being(d.answer("ready"), "ready", False),
                     headers=("retry-after",))},
    ),
]  # fmt: skip


def v1_routes(router: Router) -> None:
    router.mount(ROUTES)
