"""The OpenAPI 3.1 document of the HTTP API (`GET /openapi.json`): one entry per route here, and
the document built from the router's own list of routes, so a route without an entry stops the
server at start instead of going undocumented.

The schemas are written beside the validation they describe (service/protocols/routes.py, tasks.py,
kserve.py) and read the same limits (Config) and model facts (labels, dimension, tasks, name);
tests/system/test_openapi.py fuzzes a real server from this document with Schemathesis in both
directions: a request the schemas allow is accepted, one they forbid is refused, and every
answer matches its schema. What JSON Schema cannot say (a list as long as another, a shape
that counts the data) is listed per route under `x-ringserve-400-beyond-schema`: the 400
messages a schema-valid request can still get.

To add a route: register it in the router, then add its `Route` to `routes()` below. To add an
answer every inference route can give (a 429, say), add it to `ADMITTED`; a header every
inference request may send, to `INFERENCE_HEADERS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ringserve.service.protocols.auth import OPEN_PATH
from ringserve.service.protocols.cohere_api import EMBEDDING_TYPES, INPUT_TYPES, TRUNCATE
from ringserve.service.protocols.errors import family
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.kserve import MAX_TIMEOUT_US, VERSION, server_version
from ringserve.service.protocols.routes import Router
from ringserve.service.views import FrontView

Schema = dict[str, Any]
OPENAPI = "3.1.0"


@dataclass(frozen=True)
class Answer:
    """One status of one route: its body's schema (None: not JSON), media type and headers."""

    description: str
    schema: Schema | None = None
    media: str = "application/json"
    headers: tuple[str, ...] = ()  # names in HEADERS, always sent (NAME? when only sometimes)
    binary: bool = False  # may also come as application/octet-stream (KServe binary outputs)


@dataclass(frozen=True)
class Route:
    """What one method on one path takes and answers."""

    summary: str
    tag: str
    answers: dict[int, Answer]
    body: Schema | None = None  # the JSON request body's schema; None: no body is read
    inference: bool = False  # admitted for a worker: deadlines, 503 and 504, x-latency-ms
    model_path: bool = False  # has {model} (and maybe {version}): 404 for another
    model_body: bool = False  # takes "model" and "version" in its body: 404 for another
    repository_path: bool = False  # {model} is any name: the repository's, loaded or not
    body_optional: bool = False  # an empty body is taken as {} (tritonclient sends none)
    beyond_schema: tuple[str, ...] = ()  # regexes of 400 messages the schema cannot rule out
    description: str = ""
    examples: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Facts:
    """What the schemas read of the running server: its model and its limits."""

    model: str
    labels: list[str]
    tasks: list[str]
    dimension: int
    max_texts: int
    max_documents: int
    max_body: int
    version: str  # the model's one KServe version
    server_version: str
    key: bool  # --api-key is set: every route but the probes needs it
    models: tuple[str, ...] = ()  # every loaded model's name (empty: `model` alone)
    activation: str = "softmax"  # the model's: softmax or sigmoid

    @property
    def embeds(self) -> bool:
        return "embed" in self.tasks

    @property
    def names(self) -> list[str]:
        return list(self.models) or [self.model]


# -- pieces ---------------------------------------------------------------------------------------
def obj(required: list[str], closed: bool = True, **props: Schema | bool) -> Schema:
    """An object with these properties; `closed` forbids any other (answers are closed, so a
    field the document lacks fails the fuzzer; requests are open: unknown fields are ignored)."""
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    if closed:
        out["additionalProperties"] = False
    return out


def array(items: Schema, lo: int = 0, hi: int | None = None) -> Schema:
    out: Schema = {"type": "array", "items": items}
    if lo:
        out["minItems"] = lo
    if hi is not None:
        out["maxItems"] = hi
    return out


STRING: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
NUMBER: Schema = {"type": "number"}
INT: Schema = {"type": "integer"}
COUNT: Schema = {"type": "integer", "minimum": 0}


def not_blank() -> str:
    """A regex for "has a character that is not whitespace", whitespace as texts.checked's
    str.strip() counts it: spelled out, since a pattern's \\s (ECMA 262) counts otherwise (it
    has U+FEFF, and not U+001C to U+001F or U+0085)."""
    spaces = "".join(f"\\u{c:04x}" for c in range(0x10000) if chr(c).isspace())
    return f"[^{spaces}]"


def nullable(schema: Schema) -> Schema:
    """An optional field the server reads with dict.get: null is as if it were left out."""
    return {"anyOf": [schema, {"type": "null"}], "description": "null: as if left out"}


TEXT: Schema = {"type": "string", "pattern": not_blank(), "description": "not only whitespace"}
LONG_TEXT: Schema = {  # routes.long_text_options
    "truncate": nullable({"type": "boolean", "description": "true: cut; false: refuse (413)"}),
    "truncation_direction": nullable(
        {"enum": ["left", "right"], "description": "right keeps the start"}
    ),
}
ERROR = obj(["error"], error=STRING)
TOO_LONG = obj(
    ["error"],
    error=STRING,
    tokens=COUNT,
    max_length=COUNT,
    windows=COUNT,
    max_windows=COUNT,
    max_tokens=COUNT,  # /embed_all: the tokens whose vectors fit one answer
)
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
LATENCY = ("x-latency-ms",)


def error(description: str, *headers: str) -> Answer:
    return Answer(description, ERROR, headers=headers)


def model_fields(f: Facts, vendor: bool = False) -> dict[str, Schema]:
    """A /v1 body's optional "model" and "version" (routes.request_model): a loaded model's
    name, or (OpenAI's and Cohere's, `vendor`) any string: a name the server never held means
    its only model."""
    return {
        "model": nullable(STRING if vendor else {"enum": f.names}),
        "version": nullable({"enum": [f.version, int(f.version)]}),
    }


MODEL_404 = error('unknown model or version ("model", "version")', *LATENCY)


# Answers any route can give: the connection's limits, before routing.
EVERY_ROUTE: dict[int, Answer] = {
    400: error("malformed HTTP request, or a body or header the route refuses"),
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
        TOO_LONG,
        headers=("x-latency-ms?",),
    ),
    503: error(
        "the queue is full, the server is draining, or no worker can serve",
        "retry-after",
        "x-latency-ms?",
    ),
    504: error("the request's deadline passed first", *LATENCY),
}


# -- the routes' own schemas ----------------------------------------------------------------------
def classify_schemas(f: Facts) -> tuple[Schema, Schema]:
    """(request, answer) of POST /v1/classify (routes.classify)."""
    n = len(f.labels)
    texts = array(TEXT, 1, f.max_texts)
    named = model_fields(f)
    one = obj(["text"], closed=False, text=TEXT, text_pair=TEXT, **LONG_TEXT, **named)
    one["not"] = {"anyOf": [{"required": ["texts"]}, {"required": ["text_pairs"]}]}
    many = obj(["texts"], closed=False, texts=texts, text_pairs=texts, **LONG_TEXT, **named)
    many["not"] = {"anyOf": [{"required": ["text"]}, {"required": ["text_pair"]}]}
    result = obj(
        ["label", "label_id", "scores"],
        label={"enum": f.labels},
        label_id={"type": "integer", "minimum": 0, "maximum": n - 1},
        scores=array({"type": "number", "minimum": 0, "maximum": 1}, n, n),
        truncated={"const": True},
        tokens=COUNT,
        windows=COUNT,
    )
    batch = obj(["results"], results=array(result, 1, f.max_texts))
    return {"oneOf": [one, many]}, {"oneOf": [result, batch]}


def embedding_schemas(f: Facts) -> tuple[Schema, Schema]:
    """(request, answer) of POST /v1/embeddings (tasks.openai_embeddings)."""
    d = max(f.dimension, 1)
    request = obj(
        ["input"],
        closed=False,
        input={"oneOf": [TEXT, array(TEXT, 1, f.max_texts)]},
        **model_fields(f, vendor=True),
        encoding_format={"enum": ["float", "base64"]},
        dimensions=nullable({"type": "integer", "minimum": 1, "maximum": d}),
        **LONG_TEXT,
    )
    vector = {"oneOf": [array(NUMBER, 1, d), {"type": "string", "contentEncoding": "base64"}]}
    item = obj(
        ["object", "index", "embedding"],
        object={"const": "embedding"},
        index=COUNT,
        embedding=vector,
    )
    usage = obj(["prompt_tokens", "total_tokens"], prompt_tokens=COUNT, total_tokens=COUNT)
    answer = obj(
        ["object", "data", "model", "usage"],
        object={"const": "list"},
        data=array(item, 1, f.max_texts),
        model={"enum": f.names},
        usage=usage,
    )
    return request, answer


def document_list(f: Facts) -> Schema:
    """tasks._documents: strings, or objects with a `text`."""
    item = {"oneOf": [TEXT, obj(["text"], closed=False, text=TEXT)]}
    return array(item, 1, f.max_documents)


def rerank_common(f: Facts) -> dict[str, Schema]:
    return {"query": TEXT, "top_n": nullable({"type": "integer", "minimum": 1}), **LONG_TEXT}


def tei_schemas(f: Facts) -> dict[str, tuple[Schema, Schema]]:
    """(request, answer) of TEI's POST /embed and /rerank (tasks.tei_embed, tasks.tei_rerank)."""
    d = max(f.dimension, 1)
    embed = obj(
        ["inputs"],
        closed=False,
        inputs={"oneOf": [TEXT, array(TEXT, 1, f.max_texts)]},
        normalize=BOOL,
        **LONG_TEXT,
        **model_fields(f),
    )
    rerank = obj(
        ["query", "texts"],
        closed=False,
        texts=document_list(f),
        raw_scores=BOOL,
        return_text=BOOL,
        **rerank_common(f),
        **model_fields(f),
    )
    hit = obj(["index", "score"], index=COUNT, score=NUMBER, text=STRING)
    return {
        "embed": (embed, array(array(NUMBER, d, d), 1, f.max_texts)),
        "rerank": (rerank, array(hit, 1, f.max_documents)),
    }


def cohere_schemas(f: Facts) -> tuple[Schema, Schema]:
    """(request, answer) of Cohere's POST /v1/rerank (tasks.cohere_rerank)."""
    request = obj(
        ["query", "documents"],
        closed=False,
        documents=document_list(f),
        return_documents=BOOL,
        **rerank_common(f),
        **model_fields(f, vendor=True),
    )
    hit = obj(
        ["index", "relevance_score"],
        index=COUNT,
        relevance_score={"type": "number", "minimum": 0, "maximum": 1},
        document=obj(["text"], text=STRING),
    )
    return request, obj(["results"], results=array(hit, 1, f.max_documents))


def model_info_schema(f: Facts) -> Schema:
    """GET /v1/model (routes.model_info)."""
    return obj(
        [
            "name",
            "labels",
            "max_length",
            "fingerprint",
            "activation",
            "architecture",
            "device",
            "buckets",
            "length_classes",
            "runtime",
            "precision",
            "task",
            "dimension",
        ],
        name={"enum": f.names},
        labels={"const": f.labels},
        max_length=COUNT,
        fingerprint=STRING,
        activation={"enum": ["softmax", "sigmoid"]},
        architecture=STRING,
        device=STRING,
        buckets=array(COUNT),
        length_classes=array(COUNT),
        runtime={"enum": ["torch", "onnx"]},
        precision=STRING,
        task={"const": f.tasks},
        dimension={"const": f.dimension},
        int8={"type": "object", "description": "the int8 cost measured at export"},
        graph={
            "type": "object",
            "description": "ONNX Runtime at fp32: the graph serving (`graph`: plain or fused), "
            "what chose it and the start-up timings (--graph)",
        },
    )


def named_model_schema(f: Facts) -> Schema:
    """GET /v1/models/{model}: /v1/model's fields and OpenAI's model object's."""
    out = model_info_schema(f)
    out["required"] = [*OPENAI_MODEL, *out["required"]]
    out["properties"] = {**out["properties"], **OPENAI_MODEL}
    return out


STATES = ["LOADING", "READY", "UNLOADING", "UNAVAILABLE"]  # service/models.py


def models_schema() -> Schema:
    """GET /v1/models (routes.list_models)."""
    row = obj(
        ["name", "version", "state", "task", "labels"],
        name=STRING,
        version=STRING,
        state={"enum": STATES},
        task=array(STRING),
        labels=array(STRING),
    )
    data = {**row, "required": ["id", "object", "created", "owned_by", *row["required"]]}
    data["properties"] = {**row["properties"], **OPENAI_MODEL}
    return obj(
        ["object", "data", "models"], object={"const": "list"}, data=array(data), models=array(row)
    )


OPENAI_MODEL: dict[str, Schema] = {  # routes.openai_model
    "id": STRING,
    "object": {"const": "model"},
    "created": COUNT,
    "owned_by": STRING,
}


def repository_schemas() -> dict[str, Schema]:
    """The KServe repository extension's bodies and answers (kserve.repository_*)."""
    row = obj(["name", "state"], name=STRING, version=STRING, state={"enum": STATES}, reason=STRING)
    version = nullable({"type": ["string", "integer"], "description": "else the highest"})
    load = {
        "type": "object",
        "properties": {"version": version, "config": False},
        "patternProperties": {"^file:": False},
        "description": "Triton's config and file: overrides are not taken",
    }
    return {
        "index": obj([], closed=False, ready=BOOL, repository_name=STRING),
        "rows": array(row),
        "load": obj([], closed=False, parameters=nullable(load)),
        "unload": obj(
            [], closed=False, parameters=nullable(obj([], closed=False, unload_dependents=BOOL))
        ),
        "done": obj([]),
    }


def stats_schema() -> Schema:
    """GET /v1/stats (metrics.Metrics.snapshot and stats.Stats.last_minute): its keys closed,
    what is inside them open (worker rows as the control status's, docs/api.md)."""
    nested: Schema = {"type": "object"}
    maybe: Schema = {"type": ["number", "null"]}
    return obj(
        ["uptime_s", "model", "buckets", "queue_depth", "inflight", "requests_per_s", "workers",
         "gpus", "latency_ms"],
        uptime_s=NUMBER,
        model=obj(["name", "device"], name=STRING, device=STRING),
        buckets=array(COUNT),
        metrics=BOOL,
        draining=BOOL,
        overloaded=BOOL,
        queue_depth=COUNT,
        max_queue=COUNT,
        inflight=COUNT,
        waiting=COUNT,
        waiting_bulk=COUNT,
        bulk_max_wait_ms=NUMBER,
        queue_wait_ms=maybe,
        max_queue_ms=NUMBER,
        pool_tokens_per_s=maybe,
        requests_per_s=NUMBER,
        requests_per_s_history=array(NUMBER),
        workers=array(nested),
        restarts_total=COUNT,
        gpus=array(nested),
        totals=nested,
        latency_ms=nested,
        latency_histogram=obj(["bounds_ms", "counts"], bounds_ms=array(maybe),
                              counts=array(COUNT)),
        time_ms=obj(["queued", "model"], queued=maybe, model=maybe),
        failed=COUNT,
        tenants=array(nested),  # --api-keys: tenants.KeyRing.table
        models={"type": "object", "additionalProperties": nested},  # by name (ops/metrics.py)
    )  # fmt: skip


def tensor_meta(kind: str, dims: str) -> Schema:
    props = {"name": STRING, kind: STRING, dims: array(INT), "optional": BOOL}
    if kind == "data_type":  # a configuration's output may say how its dims are reshaped
        props["reshape"] = obj(["shape"], shape=array(INT))
    return {
        "type": "object",
        "properties": props,
        "required": ["name", kind, dims],
        "additionalProperties": False,
    }


def kserve_metadata_schemas(f: Facts) -> dict[str, Schema]:
    """GET /v2, /v2/models/{model}, its /ready and /config (kserve.py)."""
    names = f.names
    meta = tensor_meta("datatype", "shape")
    config = tensor_meta("data_type", "dims")
    return {
        "server": obj(
            ["name", "version", "extensions"],
            name={"const": "ringserve"},
            version=STRING,
            extensions=array(STRING),
        ),
        "model": obj(
            ["name", "versions", "platform", "inputs", "outputs", "parameters"],
            name={"enum": names},
            versions={"const": [f.version]},
            platform=STRING,
            inputs=array(meta),
            outputs=array(meta),
            parameters=obj(
                ["task", "dimension", "activation"], task=STRING, dimension=COUNT, activation=STRING
            ),
        ),
        "config": obj(
            ["name", "platform", "max_batch_size", "input", "output", "parameters"],
            name={"enum": names},
            platform=STRING,
            backend=STRING,
            max_batch_size=COUNT,
            input=array(config),
            output=array(config),
            dynamic_batching=obj([]),
            parameters={
                "type": "object",
                "additionalProperties": obj(["string_value"], string_value=STRING),
            },
        ),
        "ready": obj(["name", "ready"], name={"enum": names}, ready=BOOL),
    }


def infer_schemas(f: Facts) -> tuple[Schema, Schema]:
    """(request, answer) of POST /v2/models/{model}/infer (kserve.read_texts, read_outputs)."""
    shm = {  # shm_regions.placement: a registered region (system shared memory extension)
        "shared_memory_region": {"type": "string", "minLength": 1},
        "shared_memory_offset": COUNT,
        "shared_memory_byte_size": COUNT,
    }
    texts = {"oneOf": [array(TEXT), array(array(TEXT))]}
    input_params = obj([], closed=False, binary_data_size=COUNT, **shm)
    tensor_in = obj(
        ["name", "datatype", "shape"],
        closed=False,
        name={"enum": ["text", "text_pair"]},
        datatype={"const": "BYTES"},
        shape={**array(COUNT, 1, 2), "prefixItems": [COUNT, {"const": 1}]},  # [N] or [N, 1]
        data=texts,
        parameters=nullable(input_params),
    )
    outputs = ["scores", "label", *(["embedding"] if f.embeds else [])]
    out_params = obj([], closed=False, binary_data=BOOL, classification=False, **shm)
    tensor_out = obj(
        ["name"], closed=False, name={"enum": outputs}, parameters=nullable(out_params)
    )
    params = obj(
        [],
        closed=False,
        binary_data_output=BOOL,
        # lower the request's priority (never above its key's); Triton's levels: 1 the highest
        priority=nullable({"anyOf": [{"enum": ["interactive", "bulk"]}, COUNT]}),
        timeout=nullable(
            {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_US, "description": "µs"}
        ),
        **LONG_TEXT,
    )
    request = obj(
        ["inputs"],
        closed=False,
        id=nullable(STRING),
        parameters=nullable(params),
        inputs=array(tensor_in, 1, 2),
        outputs=nullable(array(tensor_out)),
    )
    data = {"oneOf": [array(NUMBER), array(STRING)]}
    answered = obj(
        ["name", "datatype", "shape"],
        name={"enum": outputs},
        datatype={"enum": ["FP32", "BYTES"]},
        shape=array(COUNT, 1, 2),
        data=data,
        parameters=obj(["binary_data_size"], binary_data_size=COUNT),
    )
    long_text = obj(["truncated", "tokens"], truncated=BOOL, tokens=STRING, windows=STRING)
    answer = obj(
        ["model_name", "model_version", "outputs"],
        model_name={"enum": f.names},
        model_version={"const": f.version},
        id=STRING,
        parameters=long_text,
        outputs=array(answered, 1, len(outputs)),
    )
    return request, answer


# -- the table ------------------------------------------------------------------------------------
def needs(f: Facts, task: str) -> tuple[str, ...]:
    """The 400 of a task the model does not do: every request to that route gets it."""
    return () if task in f.tasks else (rf"^model .* does not {task}; its tasks: ",)


PAIRS_RULE = r"^text_pairs must be a list as long as texts$"
MODEL_REQUIRED = (r"^several models are loaded \(",)  # no "model" while several are loaded
SHM_RULES = (  # shm_regions: a region not registered, or too small
    r"shared memory and (data|contents) both$",
    r"shared-memory offset or size without a region$",
    r"needs shared_memory_byte_size$",
    r"^no shared-memory region .* is registered$",
    r"runs past region",
    r"^output needs \d+ bytes, shared_memory_byte_size is \d+$",
    r"^BYTES tensor (data ends|element runs)",
    r"^input \w+ has shape .* but \d+ texts$",
)
INFER_RULES = (  # what kserve.read_texts and read_outputs check across fields
    *SHM_RULES,
    r"^inputs must be a list of one input",  # "text" present, each name once
    r"^input \w+ has shape .* but \d+ elements$",
    r"^input text_pair has \d+ texts, text has \d+$",
    r"^input \w+ has neither data nor binary_data_size$",
    r"^binary_data_size \d+ but \d+ bytes left$",
    r"^binary data given, but no input names it",
    r"^input text must hold 1 to \d+ texts$",
    r"^output '\w+' asked for twice$",
)


def ok(
    description: str,
    schema: Schema | None,
    media: str = "application/json",
    *headers: str,
    binary: bool = False,
) -> dict[int, Answer]:
    return {200: Answer(description, schema, media, headers, binary)}


def routes(f: Facts) -> dict[tuple[str, str], Route]:
    """Every HTTP route the server can register, by (method, path template)."""
    return {
        **compat_routes(f),
        **v1_routes(f),
        **health_routes(),
        **task_routes(f),
        **operator_routes(),
        **kserve_routes(f),
    }


def v1_routes(f: Facts) -> dict[tuple[str, str], Route]:
    classify_in, classify_out = classify_schemas(f)
    return {
        ("POST", "/v1/classify"): Route(
            "Classify a text, a pair, or a batch",
            "v1",
            ok("scores in label order", classify_out, "application/json", *LATENCY),
            classify_in,
            inference=True,
            beyond_schema=(PAIRS_RULE, *needs(f, "classify"), *MODEL_REQUIRED),
            examples={"one": {"text": "a fine film"}, "batch": {"texts": ["good", "bad"]}},
            model_body=True,
        ),
        ("GET", "/v1/model"): Route(
            "The served model (the first, with many)", "v1", ok("the model", model_info_schema(f))
        ),
        ("GET", "/v1/models"): Route(
            "Every model the server holds, with its state", "v1", ok("the models", models_schema())
        ),
        ("GET", "/v1/models/{model}"): Route(
            "One loaded model, as /v1/model gives it, with OpenAI's fields",
            "v1",
            ok("the model", named_model_schema(f)),
            model_path=True,
        ),
    }


def health_routes() -> dict[tuple[str, str], Route]:
    return {
        ("GET", "/v2/health/live"): Route(
            "Liveness", "health", ok("live", obj(["live"], live={"const": True}))
        ),
        ("GET", "/v2/health/ready"): Route(
            "Readiness: a worker is ready and the server is not stopping",
            "health",
            {
                **ok("ready", obj(["ready"], ready={"const": True})),
                503: Answer(
                    "not ready", obj(["ready"], ready={"const": False}), headers=("retry-after",)
                ),
            },
        ),
    }


def task_routes(f: Facts) -> dict[tuple[str, str], Route]:
    """Embeddings and reranking, in OpenAI's, TEI's and Cohere's shapes."""
    tei = tei_schemas(f)
    return {
        ("POST", "/v1/embeddings"): task_route(
            f,
            "Embeddings, in OpenAI's shape",
            "embed",
            ("the vectors", embedding_schemas(f)),
            {"input": "a fine film"},
        ),
        ("POST", "/embed"): task_route(
            f,
            "Embeddings, in TEI's shape",
            "embed",
            ("the vectors", tei["embed"]),
            {"inputs": ["a fine film"]},
        ),
        ("POST", "/rerank"): task_route(
            f,
            "Rerank documents for a query, in TEI's shape",
            "rerank",
            ("highest score first", tei["rerank"]),
            {"query": "films", "texts": ["a film", "a cat"]},
        ),
        ("POST", "/v1/rerank"): task_route(
            f,
            "Rerank documents for a query, in Cohere's shape",
            "rerank",
            ("highest score first", cohere_schemas(f)),
            {"query": "films", "documents": ["a film", "a cat"]},
        ),
    }


def task_route(
    f: Facts, summary: str, task: str, answer: tuple[str, tuple[Schema, Schema]], example: Schema
) -> Route:
    """An inference route of one task (its tag): JSON in, JSON out, 400 for a model without it."""
    description, (request, response) = answer
    return Route(
        summary,
        task,
        ok(description, response, "application/json", *LATENCY),
        request,
        inference=True,
        beyond_schema=(*needs(f, task), *MODEL_REQUIRED),
        examples={"one": example},
        model_body=True,
    )


# -- peers' shapes: TEI's routes, Cohere's v2, and each family's error body --------------------
NULL: Schema = {"type": "null"}
MAYBE_COUNT: Schema = {"type": ["integer", "null"], "minimum": 0}
TEI_ERROR_TYPES = ["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]
TOO_LONG_FIELDS: dict[str, Schema] = {
    "tokens": COUNT,
    "max_length": COUNT,
    "windows": COUNT,
    "max_windows": COUNT,
    "max_tokens": COUNT,
}


def error_schema(family: str, too_long: bool) -> Schema:
    """The error body of a family of routes (errors.error_doc), with a too-long text's counts."""
    if family == "openai":
        inner = obj(
            ["message", "type", "param", "code"],
            message=STRING,
            type=STRING,
            param=nullable(STRING),
            code=nullable(STRING),
        )
        return obj(["error"], error=counted(inner, too_long))
    if family == "tei":
        tei = obj(["error", "error_type"], error=STRING, error_type={"enum": TEI_ERROR_TYPES})
        return counted(tei, too_long)
    return counted(obj(["error", "message"], error=STRING, message=STRING), too_long)  # cohere


def counted(schema: Schema, too_long: bool) -> Schema:
    """`schema` with a too-long text's counts (admit.respond_failure) when `too_long`."""
    if too_long:
        schema["properties"] = {**schema["properties"], **TOO_LONG_FIELDS}
    return schema


# -- TEI -----------------------------------------------------------------------------------------
def prediction(f: Facts) -> Schema:
    label = {"enum": f.labels} if f.labels else STRING
    return obj(["score", "label"], score=NUMBER, label=label)


def predict_input(f: Facts) -> Schema:
    one = array(TEXT, 1, 2)  # [text] or [text, pair]
    return {"oneOf": [TEXT, one, array(one, 1, f.max_texts)]}


def predict_schemas(f: Facts) -> tuple[Schema, Schema]:
    request = obj(
        ["inputs"],
        closed=False,
        inputs=predict_input(f),
        raw_scores=BOOL,
        **LONG_TEXT,
        **model_fields(f),
    )
    pred = array(prediction(f), 1)
    return request, {"anyOf": [pred, array(pred, 1, f.max_texts)]}


def similarity_schemas(f: Facts) -> tuple[Schema, Schema]:
    pair = obj(
        ["source_sentence", "sentences"],
        closed=False,
        source_sentence=TEXT,
        sentences=array(TEXT, 1, f.max_texts - 1),
    )
    options = obj([], closed=False, prompt_name=NULL, **LONG_TEXT)
    request = obj(["inputs"], closed=False, inputs=pair, parameters=nullable(options),
                  **model_fields(f))  # fmt: skip
    return request, array(NUMBER, 1, f.max_texts - 1)


def hf_classify_request(f: Facts) -> Schema:
    """The Inference API's text-classification body (tei_api.hf_classify)."""
    params = obj(
        [],
        closed=False,
        top_k=nullable({"type": "integer", "minimum": 0}),
        function_to_apply=nullable({"enum": [f.activation, "none"]}),
    )
    return obj(["inputs", "parameters"], closed=False, inputs=predict_input(f),
               parameters=nullable(params), **model_fields(f))  # fmt: skip


def root_schemas(f: Facts) -> tuple[Schema, Schema]:
    """POST /: each body the route tells apart (tei_api.tei_root), and each answer."""
    neither = {"not": {"anyOf": [{"required": ["parameters"]}, {"required": ["query"]}]}}
    tei = tei_schemas(f)
    bodies: list[Schema] = []
    answers: list[Schema] = []
    if f.embeds:
        embed_in, embed_out = tei["embed"]
        bodies.append({**embed_in, **neither})
        answers.append(embed_out)
        sim_in, sim_out = similarity_schemas(f)
        bodies.append(sim_in)
        answers.append(sim_out)
    elif "classify" in f.tasks:
        pred_in, pred_out = predict_schemas(f)
        bodies.append({**pred_in, **neither})
        answers.append(pred_out)
    if "classify" in f.tasks:
        bodies.append(hf_classify_request(f))
        answers.append(array(array(prediction(f)), 1, f.max_texts))
    if "rerank" in f.tasks:
        bodies.append(tei["rerank"][0])
        answers.append(tei["rerank"][1])
    return {"anyOf": bodies or [obj([], closed=False)]}, {"anyOf": answers or [array(NUMBER)]}


def root_route(f: Facts) -> Route:
    request, response = root_schemas(f)
    return Route(
        "TEI's root: the model's task, as the Inference API calls a TEI endpoint",
        "tei",
        ok("the task's answer", response, "application/json", *LATENCY),
        request,
        inference=True,
        model_body=True,
        beyond_schema=tuple(r for t in ("classify", "embed", "rerank") for r in needs(f, t))
        + MODEL_REQUIRED,
        examples={"one": {"inputs": "a fine film"}},
    )


def info_schema(f: Facts) -> Schema:
    return obj(
        ["model_id", "model_type", "max_input_length", "max_batch_tokens",
         "max_client_batch_size", "version"],
        model_id={"enum": f.names},
        model_sha=nullable(STRING),
        model_dtype=STRING,
        model_type={"type": "object", "minProperties": 1, "maxProperties": 1},
        max_concurrent_requests=COUNT,
        max_input_length=COUNT,
        max_batch_tokens=COUNT,
        max_batch_requests=MAYBE_COUNT,
        max_client_batch_size=COUNT,
        auto_truncate=BOOL,
        tokenization_workers=COUNT,
        version=STRING,
        sha=nullable(STRING),
        docker_label=nullable(STRING),
        tasks=array(STRING),
    )  # fmt: skip


def token_schemas(f: Facts) -> dict[str, tuple[Schema, Schema]]:
    token = obj(
        ["id", "text", "special", "start", "stop"],
        id=COUNT, text=STRING, special=BOOL, start=MAYBE_COUNT, stop=MAYBE_COUNT,
    )  # fmt: skip
    tokenize = obj(["inputs"], closed=False, inputs={"oneOf": [TEXT, array(TEXT, 1, f.max_texts)]},
                   add_special_tokens=BOOL, **model_fields(f))  # fmt: skip
    ids = array(COUNT, 1)
    decode = obj(["ids"], closed=False, ids={"oneOf": [ids, array(ids, 1, f.max_texts)]},
                 skip_special_tokens=BOOL, **model_fields(f))  # fmt: skip
    embed_all = obj(["inputs"], closed=False, **model_fields(f))
    return {
        "tokenize": (tokenize, array(array(token), 1, f.max_texts)),
        "decode": (decode, array(STRING, 1, f.max_texts)),
        "embed_all": (embed_all, array(array(array(NUMBER)))),
    }


def tool_route(summary: str, answer: tuple[Schema, Schema], rules: tuple[str, ...]) -> Route:
    """A TEI route that answers in the front-end (no worker): its refusals still carry
    x-latency-ms (routes.inference)."""
    request, response = answer
    return Route(summary, "tei", ok("the answer", response), request, model_body=True,
                 beyond_schema=(*rules, *MODEL_REQUIRED))  # fmt: skip


def tei_routes(f: Facts) -> dict[tuple[str, str], Route]:
    tokens = token_schemas(f)
    health = {503: error("no worker is ready")}
    return {
        ("GET", "/info"): Route("TEI's model and server facts", "tei", ok("info", info_schema(f))),
        ("GET", "/health"): Route(
            "TEI's health: 200 with an empty body while a worker serves",
            "health",
            {**ok("healthy", None, "text/plain"), **health},
        ),
        ("POST", "/"): root_route(f),
        ("POST", "/predict"): task_route(
            f, "Classify a text, a pair or a batch, in TEI's shape", "classify",
            ("[{score, label}] highest first, a list a text for a batch", predict_schemas(f)),
            {"inputs": "a fine film"},
        ),
        ("POST", "/similarity"): task_route(
            f, "Cosine similarity of source_sentence to each of sentences", "embed",
            ("one similarity a sentence", similarity_schemas(f)),
            {"inputs": {"source_sentence": "a film", "sentences": ["a movie", "a cat"]}},
        ),
        ("POST", "/tokenize"): tool_route("The model's tokens of each text", tokens["tokenize"],
                                          ()),
        ("POST", "/decode"): tool_route("The text of token ids", tokens["decode"],
                                        (r"must be a list of token ids from 0 to ",)),
        ("POST", "/embed_all"): embed_all_route(f, tokens["embed_all"]),
    }  # fmt: skip


def embed_all_route(f: Facts, schemas: tuple[Schema, Schema]) -> Route:
    """TEI's token vectors: an embed route that takes /embed's body, refused (400) by an
    artifact or runtime without them, 413 for vectors too many for one answer."""
    request = tei_schemas(f)["embed"][0]
    route = task_route(
        f, "Token vectors of each text, in TEI's shape", "embed",
        ("a list a text of a vector a token", (request, schemas[1])), {"inputs": "a fine film"},
    )  # fmt: skip
    rules = (r"^/embed_all is (not served by|served on ONNX Runtime only)",)
    return replace(route, beyond_schema=(*route.beyond_schema, *rules))


# -- Cohere v2 -----------------------------------------------------------------------------------
def cohere_routes(f: Facts) -> dict[tuple[str, str], Route]:
    d = max(f.dimension, 1)
    embed_in = obj(
        ["texts"],
        closed=False,
        texts=array(TEXT, 1, f.max_texts),
        input_type=nullable({"enum": list(INPUT_TYPES)}),
        embedding_types=nullable(array({"enum": list(EMBEDDING_TYPES)}, 1)),
        truncate=nullable({"enum": list(TRUNCATE)}),
        output_dimension=nullable({"type": "integer", "minimum": 1, "maximum": d}),
        max_tokens=NULL,
        images=NULL,
        inputs=NULL,
        **model_fields(f, vendor=True),
    )
    meta: Schema = {"type": "object"}
    vectors = obj([], float=array(array(NUMBER, 1, d)), base64=array(STRING))
    embed_out = obj(["id", "response_type", "embeddings", "texts", "meta"], id=STRING,
                    response_type={"const": "embeddings_by_type"}, embeddings=vectors,
                    texts=array(STRING), meta=meta)  # fmt: skip
    rerank_in = obj(["query", "documents"], closed=False, documents=document_list(f),
                    max_tokens_per_doc=NULL, **rerank_common(f),
                    **model_fields(f, vendor=True))  # fmt: skip
    hit = obj(["index", "relevance_score"], index=COUNT,
              relevance_score={"type": "number", "minimum": 0, "maximum": 1})  # fmt: skip
    rerank_out = obj(["id", "results", "meta"], id=STRING, results=array(hit, 1), meta=meta)
    return {
        ("POST", "/v2/embed"): task_route(
            f, "Embeddings, in Cohere's v2 shape", "embed", ("by type", (embed_in, embed_out)),
            {"texts": ["a fine film"], "input_type": "search_document"},
        ),
        ("POST", "/v2/rerank"): task_route(
            f, "Rerank documents, in Cohere's v2 shape", "rerank",
            ("highest score first", (rerank_in, rerank_out)),
            {"query": "films", "documents": ["a film", "a cat"]},
        ),
    }  # fmt: skip


def compat_routes(f: Facts) -> dict[tuple[str, str], Route]:
    return {**tei_routes(f), **cohere_routes(f)}


def operator_routes() -> dict[tuple[str, str], Route]:
    """What operators read (ops/metrics.py), and this document."""
    return {
        ("GET", "/metrics"): Route(
            "Prometheus metrics", "operator", ok("text exposition format 0.0.4", None, "text/plain")
        ),
        ("GET", "/v1/stats"): Route(
            "JSON for dashboards", "operator", ok("the server's figures", stats_schema())
        ),
        ("GET", "/dashboard"): Route(
            "The operator page", "operator", ok("an HTML page", None, "text/html")
        ),
        ("GET", "/docs"): Route(
            "Swagger UI for this document (off: --no-docs-page)",
            "meta",
            ok("an HTML page", None, "text/html"),
        ),
        ("GET", "/docs/openapi.json"): Route(
            "On the operator port: the HTTP port's document, which /docs there shows",
            "meta",
            ok("OpenAPI 3.1", obj(["openapi", "info", "paths"], closed=False)),
        ),
        ("GET", "/docs/swagger-ui.css"): Route(
            "Swagger UI's style sheet", "meta", ok("CSS", None, "text/css")
        ),
        ("GET", "/docs/swagger-ui-bundle.js"): Route(
            "Swagger UI's script", "meta", ok("JavaScript", None, "text/javascript")
        ),
        ("GET", "/openapi.json"): Route(
            "This document",
            "meta",
            ok("OpenAPI 3.1", obj(["openapi", "info", "paths"], closed=False)),
        ),
    }


INFER_DESCRIPTION = (
    "The binary tensor data extension works both ways: a body may be the JSON header followed "
    "by tensor data, its length in Inference-Header-Content-Length (and gzip or deflate "
    "Content-Encoding); with binary outputs the answer is application/octet-stream, the "
    "header's length in Inference-Header-Content-Length."
)
INFER_EXAMPLE = {
    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a fine film"]}]
}


def kserve_routes(f: Facts) -> dict[tuple[str, str], Route]:
    """KServe v2: server metadata, and each model route with and without its version."""
    k = kserve_metadata_schemas(f)
    table = {
        ("GET", "/v2"): Route(
            "KServe v2 server metadata", "kserve", ok("server metadata", k["server"])
        ),
    }
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        table.update(kserve_model_routes(f, k, base))
        table[("GET", base + "/stats")] = Route(
            "Triton's statistics of a model (all its versions) or of one version",
            "kserve",
            ok("statistics", model_stats_schema(f)),
            model_path=True,
        )
    table[("GET", "/v2/models/stats")] = Route(
        "Triton's statistics of every model", "kserve", ok("statistics", model_stats_schema(f))
    )
    table.update(repository_routes())
    table.update(shm_routes())
    return table


def model_stats_schema(f: Facts) -> Schema:
    """kserve.stats_doc: Triton's model_stats (ops/inference_stats.py)."""
    duration = obj(["count", "ns"], count=COUNT, ns=COUNT)
    phases = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
    row = obj(
        ["name", "version", "last_inference", "inference_count", "execution_count"],
        name={"enum": f.names},
        version=STRING,
        last_inference=COUNT,
        inference_count=COUNT,
        execution_count=COUNT,
        inference_stats={
            "type": "object",
            "properties": dict.fromkeys(phases, duration),
            "required": list(phases),
            "additionalProperties": False,
        },
        batch_stats=array(obj([], closed=False)),
    )
    return obj(["model_stats"], model_stats=array(row))


SHM_REGISTER_RULES = (  # shm_regions.SystemRegions.register: what the key and range must be
    r"^cannot open shared memory",
    r"is not a POSIX shared-memory name$",
    r"names one of the server's own segments$",
    r"is already registered$",
    r"runs past the \d+ bytes of",
    r"shared-memory regions are registered already$",
)


def shm_routes() -> dict[tuple[str, str], Route]:
    """Triton's system shared-memory extension (shm_regions.py)."""
    region = obj(
        ["name", "key", "offset", "byte_size"],
        name=STRING,
        key=STRING,
        offset=COUNT,
        byte_size=COUNT,
    )
    status = ok("the registered regions", array(region))
    done = ok("done", obj([]))
    base = "/v2/systemsharedmemory"
    unknown = (r"^no shared-memory region .* is registered$",)
    body = obj(
        ["key", "byte_size"],
        closed=False,
        key=STRING,
        offset=COUNT,
        byte_size={"type": "integer", "minimum": 1},
    )
    return {
        ("GET", base + "/status"): Route("Every registered region", "kserve", status),
        ("GET", base + "/region/{region}/status"): Route(
            "One registered region", "kserve", status, beyond_schema=unknown
        ),
        ("POST", base + "/region/{region}/register"): Route(
            "Map a region of a POSIX shared-memory object (the client's: never unlinked)",
            "kserve",
            done,
            body,
            beyond_schema=SHM_REGISTER_RULES,
        ),
        ("POST", base + "/unregister"): Route(
            "Unmap every region", "kserve", done, body_optional=True
        ),
        ("POST", base + "/region/{region}/unregister"): Route(
            "Unmap a region (an unknown one is no error)", "kserve", done, body_optional=True
        ),
        ("GET", "/v2/cudasharedmemory/status"): Route(
            "CUDA shared memory: none is served, so none is registered",
            "kserve",
            ok("[]", array(region)),
        ),
        ("POST", "/v2/cudasharedmemory/unregister"): Route(
            "CUDA shared memory: nothing to unregister", "kserve", done, body_optional=True
        ),
        ("POST", "/v2/cudasharedmemory/region/{region}/register"): Route(
            "CUDA shared memory is not served: always 400",
            "kserve",
            {400: error("CUDA shared memory is not served")},
            obj([], closed=False),
            beyond_schema=(r"^CUDA shared memory is not served",),
        ),
    }


REPOSITORY_ERRORS = {
    400: error("a bad body, a bad artifact (the reason), or --model-control none refuses"),
    404: error("no such model in the repository"),
    405: error("--model-control none: the server's models are fixed"),
    409: error("the load would exceed --memory-budget (the reason)"),
    503: error("the server is draining", "retry-after?"),
}


# What a well-formed load or unload can still be refused with (400): the server's model control,
# or an artifact that fails its checks.
REPOSITORY_RULES = (r"--model-control", r"^bad artifact", r"fingerprint")


def repository_routes() -> dict[tuple[str, str], Route]:
    """The KServe repository extension, as tritonclient's get_model_repository_index,
    load_model and unload_model call it."""
    r = repository_schemas()
    done = ok("done: the model serves (load) or is gone (unload)", r["done"])
    return {
        ("POST", "/v2/repository/index"): Route(
            "Every model of the repository, loaded or not (an empty body is taken)",
            "kserve",
            ok("one row a (name, version)", r["rows"]),
            r["index"],
            body_optional=True,
        ),
        ("POST", "/v2/repository/models/{model}/load"): Route(
            "Load a model (answered once it serves)",
            "kserve",
            {**REPOSITORY_ERRORS, **done},
            r["load"],
            repository_path=True,
            beyond_schema=REPOSITORY_RULES,
            body_optional=True,
        ),
        ("POST", "/v2/repository/models/{model}/unload"): Route(
            "Unload a model (answered once what was admitted for it is answered)",
            "kserve",
            {**REPOSITORY_ERRORS, **done},
            r["unload"],
            repository_path=True,
            beyond_schema=REPOSITORY_RULES,
            body_optional=True,
        ),
    }


def kserve_model_routes(f: Facts, k: dict[str, Schema], base: str) -> dict[tuple[str, str], Route]:
    infer_in, infer_out = infer_schemas(f)
    not_ready = {503: Answer("not ready", k["ready"], headers=("retry-after",))}
    return {
        ("GET", base): Route(
            "KServe v2 model metadata", "kserve", ok("model metadata", k["model"]), model_path=True
        ),
        ("GET", base + "/ready"): Route(
            "KServe v2 model readiness",
            "kserve",
            {**ok("ready", k["ready"]), **not_ready},
            model_path=True,
        ),
        ("GET", base + "/config"): Route(
            "Triton's model configuration",
            "kserve",
            ok("model configuration", k["config"]),
            model_path=True,
        ),
        ("POST", base + "/infer"): Route(
            "KServe v2 inference",
            "kserve",
            ok(
                "the outputs asked for (all of them when none is named)",
                infer_out,
                "application/json",
                *LATENCY,
                binary=True,
            ),
            infer_in,
            inference=True,
            model_path=True,
            beyond_schema=(*INFER_RULES, *needs(f, "classify")),
            description=INFER_DESCRIPTION,
            examples={"one": INFER_EXAMPLE},
        ),
    }


# -- the document ---------------------------------------------------------------------------------
class Undocumented(Exception):
    """A route was registered that has no entry in routes()."""


def check_covered(registered: list[tuple[str, str]], f: Facts) -> None:
    table = routes(f)
    missing = [f"{m} {p}" for m, p in registered if (m, p) not in table]
    if missing:
        raise Undocumented(
            "routes without an OpenAPI entry in service/protocols/openapi.py: " + ", ".join(missing)
        )


def example_path(template: str, f: Facts) -> bytes:
    return template.replace("{model}", f.model).replace("{version}", f.version).encode()


def answers_of(route: Route, path: str, f: Facts) -> dict[int, Answer]:
    """The route's own answers over those any route, admitted request or model path gives."""
    out = dict(EVERY_ROUTE)
    if f.key and not OPEN_PATH.match(example_path(path, f)):
        out[401] = error("missing or invalid API key", "www-authenticate")
    if route.inference:
        out.update(ADMITTED)
        if f.key:  # --api-keys: a key over its rate
            out[429] = error("over the key's rate (--api-keys)", "retry-after", "x-latency-ms?")
    if route.model_path:
        out[404] = error("unknown model or version", *(LATENCY if route.inference else ()))
    if route.model_body:
        out[404] = MODEL_404
    out.update(route.answers)
    kind = family(path.encode())
    if kind:  # OpenAI's, TEI's and Cohere's routes answer errors in their own shape
        for status, a in out.items():
            if a.schema is ERROR or a.schema is TOO_LONG:
                out[status] = replace(a, schema=error_schema(kind, a.schema is TOO_LONG))
    return dict(sorted(out.items()))


def response_doc(answer: Answer) -> Schema:
    headers = {"x-request-id": {"required": True, "schema": STRING, **HEADERS["x-request-id"]}}
    for name in answer.headers:
        key = name.rstrip("?")
        headers[key] = {"required": key == name, "schema": STRING, **HEADERS[key]}
    content: Schema = {answer.media: {"schema": answer.schema} if answer.schema else {}}
    if answer.binary:
        content["application/octet-stream"] = {
            "schema": {"type": "string", "contentMediaType": "application/octet-stream"}
        }
    return {"description": answer.description, "headers": headers, "content": content}


def path_parameters(path: str, route: Route, f: Facts) -> list[Schema]:
    params = []
    if "{model}" in path:
        schema = STRING if route.repository_path else {"enum": f.names}
        params.append({"name": "model", "in": "path", "required": True, "schema": schema})
    if "{version}" in path:
        params.append(
            {"name": "version", "in": "path", "required": True, "schema": {"enum": [f.version]}}
        )
    if "{region}" in path:  # a system shared-memory region's name: any
        params.append({"name": "region", "in": "path", "required": True, "schema": STRING})
    return params


def operation(method: str, path: str, route: Route, f: Facts) -> Schema:
    op: Schema = {
        "summary": route.summary,
        "tags": [route.tag],
        "operationId": (method + path)
        .lower()
        .replace("/", "_")
        .strip("_")
        .replace("{", "")
        .replace("}", "")
        .replace(".", "_"),
        "responses": {str(s): response_doc(a) for s, a in answers_of(route, path, f).items()},
    }
    if route.description:
        op["description"] = route.description
    params = path_parameters(path, route, f) + (INFERENCE_HEADERS if route.inference else [])
    if params:
        op["parameters"] = params
    if route.body is not None:
        media: Schema = {"schema": route.body}
        if route.examples:
            media["examples"] = {k: {"value": v} for k, v in route.examples.items()}
        content = {"application/json": media}
        op["requestBody"] = {"required": not route.body_optional, "content": content}
    if route.beyond_schema:
        op["x-ringserve-400-beyond-schema"] = list(route.beyond_schema)
    if f.key and not OPEN_PATH.match(example_path(path, f)):
        op["security"] = [{"bearer": []}]
    return op


def document(registered: list[tuple[str, str]], f: Facts) -> Schema:
    """The OpenAPI document of these routes, as this server answers them."""
    check_covered(registered, f)
    table = routes(f)
    paths: dict[str, Schema] = {}
    for method, path in registered:
        paths.setdefault(path, {})[method.lower()] = operation(method, path, table[method, path], f)
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
    if f.key:
        doc["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
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
        dimension=m.dimension,
        max_texts=s.max_texts,
        max_documents=s.max_documents,
        max_body=s.max_body,
        version=VERSION,
        server_version=server_version(),
        key=key,
        models=tuple(sorted({info.name for info in server.models.ready()})),
        activation=m.activation,
    )


def render(router: Router, key: bool) -> bytes:
    """The document of `router`'s routes, as /openapi.json serves it (also on the operator
    port's /docs/openapi.json: service/ops/apidocs.py)."""
    return json.dumps(document(router.routes, facts(router.server, key))).encode()


def register(router: Router, key: bool) -> None:
    """Serve GET /openapi.json for the routes registered so far (call it last); a route with no
    entry stops the start here. The document is built per request from the model of the time
    (a reload may change the model's fingerprint; its labels never change)."""
    server = router.server

    def serve(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, json.dumps(document(router.routes, facts(server, key))).encode())

    router.add("GET", "/openapi.json", serve)
    check_covered(router.routes, facts(server, key))
