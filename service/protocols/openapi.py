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

import dataclasses
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ringserve.service.kserve import tokens as kserve_tokens
from ringserve.service.kserve.documents import VERSION
from ringserve.service.protocols import errors, schemas, token_classify
from ringserve.service.protocols.auth import OPEN_PATH
from ringserve.service.protocols.errors import family
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router
from ringserve.service.protocols.schemas import cohere as cohere_structs
from ringserve.service.protocols.schemas import kserve as kserve_structs
from ringserve.service.protocols.schemas import multivector as multivector_schemas
from ringserve.service.protocols.schemas import operator as operator_structs
from ringserve.service.protocols.schemas import server as server_bodies
from ringserve.service.protocols.schemas import sparse as sparse_structs
from ringserve.service.protocols.schemas import tasks as task_schemas
from ringserve.service.protocols.schemas import tei as tei_structs
from ringserve.service.protocols.schemas import tokens as token_structs
from ringserve.service.protocols.schemas import v1 as v1_schemas
from ringserve.service.protocols.schemas.v1 import ONE_OR_MANY
from ringserve.service.request import sparse_terms
from ringserve.service.version import version
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


STRING: Schema = {"type": "string"}  # a header's or a path parameter's value
# Each family's error body, and with a too-long text's counts: errors.py's Structs.
_ERROR_KINDS = [kind for pair in errors.BODIES.values() for kind in pair]
_ERROR_REFS, ERROR_COMPONENTS = schemas.components(_ERROR_KINDS)
ERROR_SCHEMAS = {
    (name, counted): _ERROR_REFS[2 * i + counted]
    for i, name in enumerate(errors.BODIES)
    for counted in (False, True)
}
ERROR, TOO_LONG = ERROR_SCHEMAS["", False], ERROR_SCHEMAS["", True]
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
    """(request, answer) of POST /v1/classify (routes.classify): its Structs'."""
    one, batch = answer(f, "classify"), answer(f, "classify_batch")
    return {"allOf": [body(f, "classify"), ONE_OR_MANY]}, {"oneOf": [one, batch]}


def embedding_schemas(f: Facts) -> tuple[Schema, Schema]:
    """(request, answer) of POST /v1/embeddings (tasks.openai_embeddings)."""
    return body(f, "openai_embeddings"), answer(f, "openai_embeddings")


def tei_schemas(f: Facts) -> dict[str, tuple[Schema, Schema]]:
    """(request, answer) of TEI's POST /embed and /rerank (tasks.tei_embed, tasks.tei_rerank)."""
    return {
        "embed": (body(f, "tei_embed"), answer(f, "tei_embed")),
        "rerank": (body(f, "tei_rerank"), answer(f, "tei_rerank")),
    }


def cohere_schemas(f: Facts) -> tuple[Schema, Schema]:
    """(request, answer) of Cohere's POST /v1/rerank (tasks.cohere_rerank)."""
    return body(f, "cohere_rerank"), answer(f, "cohere_rerank")


def repository_schemas(f: Facts) -> dict[str, Schema]:
    """The KServe repository extension's bodies and answers (kserve.repository_*)."""
    return {
        "index": body(f, "repository_index"),
        "rows": answer(f, "kserve_rows"),
        "load": body(f, "repository_load"),
        "unload": body(f, "repository_unload"),
        "done": answer(f, "kserve_done"),
    }


def kserve_metadata_schemas(f: Facts) -> dict[str, Schema]:
    """GET /v2, /v2/models/{model}, its /ready and /config (kserve.py)."""
    return {name: answer(f, "kserve_" + name) for name in ("server", "model", "config", "ready")}


def infer_schemas(f: Facts) -> tuple[Schema, Schema]:
    """(request, answer) of POST /v2/models/{model}/infer (kserve.read_texts, read_outputs)."""
    return body(f, "infer"), answer(f, "kserve_infer")


# -- the table ------------------------------------------------------------------------------------
def needs(f: Facts, task: str) -> tuple[str, ...]:
    """The 400 of a task the model does not do: every request to that route gets it."""
    return () if task in f.tasks else (rf"^model .* does not {task}; its tasks: ",)


PAIRS_RULE = r"^text_pairs must be a list as long as texts$"
STRIDE_RULE = r"^(parameters\.)?stride must be an integer from 0 to \d+ "  # token classifiers
PROMPT_RULE = r"^prompt_name .* is not one of this model's prompts"
TOKEN_ID_RULES = (  # tasks.openai_inputs and vocab.text_of_ids: ids the model's tokenizer refuses
    r"^input mixes texts, token ids and lists of token ids$",
    r"token id \d+ is not in model .*'s vocabulary",
    r"token ids must start with .* special tokens",
    r"these token ids are not a tokenization by",
    r"^input(\[\d+\])? is empty$",
)
PREDICT_RULES = (  # tei_api.predict_inputs: a list of texts is one sequence, of lists a batch
    r"^inputs(\[\d+\])? must be ",
    r"^parameters.function_to_apply may be \w+ or none for ",  # the model's own activation
)
COMPACT_RULES = (  # compact.check: int8/uint8 without their calibration's vectors
    r"^u?int8 is not served by model .*: its artifact has no calibration",
    r"^u?int8 ranges are calibrated on the model's ",
)
LATE_RULES = (  # late_chunking.py: a model without token states, a chunk without a token
    r"^late_chunking takes texts, not token ids$",
    r"^late_chunking is not served by model ",
    r"^late_chunking cannot pool by ",
    r"^input\[\d+\] has no tokens of its own$",
    r"^this document cannot be windowed on its tokens' boundaries$",
)
EMBED_RULES = {  # what a schema-valid body to each embedding route can still be refused for
    "/v1/embeddings": (
        PROMPT_RULE,
        r"^dimensions must be an integer from 1 to the model's \d+$",
        r"^input must hold 1 to \d+ items, not \d+$",  # a batch: one list of ids is one text
        *TOKEN_ID_RULES,
        *COMPACT_RULES,
        *LATE_RULES,
    ),
    "/embed": (PROMPT_RULE, *COMPACT_RULES, *LATE_RULES),
}
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
    r"^input data mixes rows and texts$",
    r"^unknown output '(embedding|token_\w+)': the model gives",  # a model without them
    r"^unknown output '(scores|label|embedding)': the model gives token",  # a token model
    r"^model .* classifies the tokens of one text: no text_pair$",
    r"^parameters\.stride reads a long text in windows: no truncate with it$",
    STRIDE_RULE,
    PROMPT_RULE,
)


# A multivector model's infer scores pairs (multivector.kserve_ask): a text without its pair.
MULTIVECTOR_INFER = (
    r"scores a query \(text\) against a document \(text_pair\) by MaxSim",
    r"^unknown output 'label': the model gives scores$",
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
        **health_routes(f),
        **task_routes(f),
        **token_routes(f),
        **operator_routes(f),
        **kserve_routes(f),
        **sparse_routes(f),
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
            "The served model (the first, with many)", "v1", ok("the model", answer(f, "model"))
        ),
        ("GET", "/v1/models"): Route(
            "Every model the server holds, with its state",
            "v1",
            ok("the models", answer(f, "models")),
        ),
        ("GET", "/v1/models/{model}"): Route(
            "One loaded model, as /v1/model gives it, with OpenAI's fields",
            "v1",
            ok("the model", answer(f, "named_model")),
            model_path=True,
        ),
    }


def being(schema: Schema, field: str, value: Any) -> Schema:
    """`schema` with one field's value fixed (a probe's `ready` true with 200, false with 503)."""
    return {"allOf": [schema, {"properties": {field: {"const": value}}}]}


def health_routes(f: Facts) -> dict[tuple[str, str], Route]:
    return {
        ("GET", "/v2/health/live"): Route("Liveness", "health", ok("live", answer(f, "live"))),
        ("GET", "/v2/health/ready"): Route(
            "Readiness: a worker is ready and the server is not stopping",
            "health",
            {
                **ok("ready", being(answer(f, "ready"), "ready", True)),
                503: Answer(
                    "not ready",
                    being(answer(f, "ready"), "ready", False),
                    headers=("retry-after",),
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
            EMBED_RULES["/v1/embeddings"],
        ),
        ("POST", "/embed"): task_route(
            f,
            "Embeddings, in TEI's shape",
            "embed",
            ("the vectors", tei["embed"]),
            {"inputs": ["a fine film"]},
            EMBED_RULES["/embed"],
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
        ("POST", "/v1/embeddings/multi"): task_route(
            f,
            "Token vectors of a multivector (ColBERT) model, one matrix a text",
            "multivector",
            ("one matrix a text", (body(f, "multi_embeddings"), answer(f, "multi_embeddings"))),
            {"input": ["a fine film"], "input_type": "document"},
        ),
    }


def task_route(
    f: Facts,
    summary: str,
    task: str,
    answer: tuple[str, tuple[Schema, Schema]],
    example: Schema,
    rules: tuple[str, ...] = (),
) -> Route:
    """An inference route of one task (its tag): JSON in, JSON out, 400 for a model without it."""
    description, (request, response) = answer
    return Route(
        summary,
        task,
        ok(description, response, "application/json", *LATENCY),
        request,
        inference=True,
        beyond_schema=(*needs(f, task), *MODEL_REQUIRED, *rules),
        examples={"one": example},
        model_body=True,
    )


TOKEN_RULES = (  # token_classify: what a schema-valid body can still be refused for
    STRIDE_RULE,
    r"^stride reads a long text in windows: it goes without truncate$",
    r"^threshold must be a number from 0 to 1$",
)


def token_routes(f: Facts) -> dict[tuple[str, str], Route]:
    """Token classification (protocols/token_classify.py)."""
    request, response = token_structs.schemas(f.max_texts)[:2]
    return {
        ("POST", token_classify.PATH): task_route(
            f,
            "Entities in a text, or a batch, as transformers' token-classification pipeline",
            token_classify.TASK,
            ("one text's entities, or {results} for texts", (request, response)),
            {"text": "Angela Merkel visited Paris", "aggregation": "simple"},
            TOKEN_RULES,
        )
    }


# -- peers' shapes: TEI's routes, Cohere's v2, and each family's error body --------------------
def error_schema(family: str, too_long: bool) -> Schema:
    """The error body of a family of routes (errors.error_doc), with a too-long text's counts."""
    return ERROR_SCHEMAS[family, too_long]


# -- TEI -----------------------------------------------------------------------------------------
def predict_schemas(f: Facts) -> tuple[Schema, Schema]:
    one, batch = answer(f, "prediction"), answer(f, "predictions")
    return body(f, "predict"), {"anyOf": [one, batch]}


def similarity_schemas(f: Facts) -> tuple[Schema, Schema]:
    return body(f, "similarity"), answer(f, "similarity")


def root_schemas(f: Facts) -> tuple[Schema, Schema]:
    """POST /: each body the route tells apart (tei_api.tei_root), and each answer."""
    neither = {"not": {"anyOf": [{"required": ["parameters"]}, {"required": ["query"]}]}}
    tei = tei_schemas(f)
    bodies: list[Schema] = []
    answers: list[Schema] = []
    if f.embeds:
        embed_in, embed_out = tei["embed"]
        bodies.append({"allOf": [embed_in, neither]})
        answers.append(embed_out)
        sim_in, sim_out = similarity_schemas(f)
        bodies.append(sim_in)
        answers.append(sim_out)
    elif "classify" in f.tasks:
        pred_in, pred_out = predict_schemas(f)
        bodies.append({"allOf": [pred_in, neither]})
        answers.append(pred_out)
    if "classify" in f.tasks:
        bodies.append(body(f, "hf_classify"))
        answers.append(answer(f, "hf_classify"))
    if "rerank" in f.tasks:
        bodies.append(tei["rerank"][0])
        answers.append(tei["rerank"][1])
    nothing: Schema = {"type": "object"}  # a model with none of these tasks: refused (400)
    return {"anyOf": bodies or [nothing]}, {"anyOf": answers or [{"type": "array"}]}


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
        + MODEL_REQUIRED
        + EMBED_RULES["/embed"]
        + PREDICT_RULES,
        examples={"one": {"inputs": "a fine film"}},
    )


def token_schemas(f: Facts) -> dict[str, tuple[Schema, Schema]]:
    tokenize, decode, embed_all = body(f, "tokenize"), body(f, "decode"), body(f, "embed_all")
    return {
        "tokenize": (tokenize, answer(f, "tokenize")),
        "decode": (decode, answer(f, "decode")),
        "embed_all": (embed_all, answer(f, "embed_all")),
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
        ("GET", "/info"): Route("TEI's model and server facts", "tei",
                                ok("info", answer(f, "info"))),
        ("GET", "/health"): Route(
            "TEI's health: 200 with an empty body while a worker serves",
            "health",
            {**ok("healthy", None, "text/plain"), **health},
        ),
        ("POST", "/"): root_route(f),
        ("POST", "/predict"): task_route(
            f, "Classify a text, a pair or a batch, in TEI's shape", "classify",
            ("[{score, label}] highest first, a list a text for a batch", predict_schemas(f)),
            {"inputs": "a fine film"}, PREDICT_RULES,
        ),
        ("POST", "/similarity"): task_route(
            f, "Cosine similarity of source_sentence to each of sentences", "embed",
            ("one similarity a sentence", similarity_schemas(f)),
            {"inputs": {"source_sentence": "a film", "sentences": ["a movie", "a cat"]}},
        ),
        ("POST", "/tokenize"): tool_route("The model's tokens of each text", tokens["tokenize"],
                                          ()),
        ("POST", "/decode"): tool_route("The text of token ids", tokens["decode"],
                                        (r"must be a list of token ids from 0 to ",
                                         r"^ids must be a list of token ids, or a list of such",
                                         r"^ids must hold 1 to \d+ lists$")),
        ("POST", "/embed_all"): embed_all_route(f, tokens["embed_all"]),
    }  # fmt: skip


def embed_all_route(f: Facts, pair: tuple[Schema, Schema]) -> Route:
    """TEI's token vectors: an embed route (/embed's body less `normalize`), refused (400) by an
    artifact or runtime without them, 413 for vectors too many for one answer."""
    route = task_route(
        f, "Token vectors of each text, in TEI's shape", "embed",
        ("a list a text of a vector a token", pair), {"inputs": "a fine film"},
    )  # fmt: skip
    rules = (r"^/embed_all is (not served by|served on ONNX Runtime only)", *EMBED_RULES["/embed"])
    return replace(route, beyond_schema=(*route.beyond_schema, *rules))


# -- Cohere v2 -----------------------------------------------------------------------------------
def cohere_routes(f: Facts) -> dict[tuple[str, str], Route]:
    embed_in, embed_out = body(f, "cohere_embed"), answer(f, "cohere_embed")
    rerank_in, rerank_out = body(f, "cohere_rerank_v2"), answer(f, "cohere_rerank_v2")
    return {
        ("POST", "/v2/embed"): task_route(
            f, "Embeddings, in Cohere's v2 shape", "embed", ("by type", (embed_in, embed_out)),
            {"texts": ["a fine film"], "input_type": "search_document"},
            (r"^output_dimension must be an integer from 1 to the model's \d+$", *COMPACT_RULES),
        ),
        ("POST", "/v2/rerank"): task_route(
            f, "Rerank documents, in Cohere's v2 shape", "rerank",
            ("highest score first", (rerank_in, rerank_out)),
            {"query": "films", "documents": ["a film", "a cat"]},
        ),
    }  # fmt: skip


# -- a sparse (SPLADE) model: service/protocols/sparse_api.py ------------------------------------
SPARSE_RULES = (r"^model .* gives no sparse vectors", PROMPT_RULE)


def sparse_outputs_rule(f: Facts) -> tuple[str, ...]:
    """KServe's outputs of another kind of model than this one (sparse_terms.OUTPUTS are a
    sparse model's only)."""
    if "sparse" in f.tasks:
        return (r"^unknown output '\w+': the model gives sparse_indices",)
    return (r"^unknown output 'sparse_\w+': the model gives",)


def sparse_routes(f: Facts) -> dict[tuple[str, str], Route]:
    tei = (body(f, "embed_sparse"), answer(f, "embed_sparse"))
    ours = (body(f, "sparse_embeddings"), answer(f, "sparse_embeddings"))
    return {
        ("POST", "/embed_sparse"): task_route(
            f, "Sparse vectors (SPLADE), in TEI's shape", "sparse",
            ("a list a text of its nonzero terms, ids ascending", tei),
            {"inputs": ["a fine film"]}, SPARSE_RULES,
        ),
        ("POST", "/v1/embeddings/sparse"): task_route(
            f, "Sparse vectors (SPLADE): indices and values a text, pruned on request", "sparse",
            ("each text's nonzero terms, ids ascending", ours),
            {"input": "a fine film", "top_k": 64, "return_tokens": True}, SPARSE_RULES,
        ),
    }  # fmt: skip


def compat_routes(f: Facts) -> dict[tuple[str, str], Route]:
    return {**tei_routes(f), **cohere_routes(f)}


def operator_routes(f: Facts) -> dict[tuple[str, str], Route]:
    """What operators read (ops/metrics.py), and this document."""
    document = answer(f, "document")
    return {
        ("GET", "/metrics"): Route(
            "Prometheus metrics", "operator", ok("text exposition format 0.0.4", None, "text/plain")
        ),
        ("GET", "/v1/stats"): Route(
            "JSON for dashboards", "operator", ok("the server's figures", answer(f, "stats"))
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
            ok("OpenAPI 3.1", document),
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
            ok("OpenAPI 3.1", document),
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
            ok("statistics", answer(f, "kserve_stats")),
            model_path=True,
        )
    table[("GET", "/v2/models/stats")] = Route(
        "Triton's statistics of every model", "kserve", ok("statistics", answer(f, "kserve_stats"))
    )
    table.update(repository_routes(f))
    table.update(shm_routes(f))
    return table


SHM_REGISTER_RULES = (  # shm_regions.SystemRegions.register: what the key and range must be
    r"^cannot open shared memory",
    r"is not a POSIX shared-memory name$",
    r"names one of the server's own segments$",
    r"is already registered$",
    r"runs past the \d+ bytes of",
    r"shared-memory regions are registered already$",
)


def shm_routes(f: Facts) -> dict[tuple[str, str], Route]:
    """Triton's system shared-memory extension (shm_regions.py)."""
    regions = answer(f, "kserve_regions")
    status = ok("the registered regions", regions)
    done = ok("done", answer(f, "kserve_done"))
    base = "/v2/systemsharedmemory"
    unknown = (r"^no shared-memory region .* is registered$",)
    register = body(f, "register_region")
    return {
        ("GET", base + "/status"): Route("Every registered region", "kserve", status),
        ("GET", base + "/region/{region}/status"): Route(
            "One registered region", "kserve", status, beyond_schema=unknown
        ),
        ("POST", base + "/region/{region}/register"): Route(
            "Map a region of a POSIX shared-memory object (the client's: never unlinked)",
            "kserve",
            done,
            register,
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
            ok("[]", regions),
        ),
        ("POST", "/v2/cudasharedmemory/unregister"): Route(
            "CUDA shared memory: nothing to unregister", "kserve", done, body_optional=True
        ),
        ("POST", "/v2/cudasharedmemory/region/{region}/register"): Route(
            "CUDA shared memory is not served: always 400",
            "kserve",
            {400: error("CUDA shared memory is not served")},
            body(f, "anything"),
            beyond_schema=(r"^CUDA shared memory is not served",),
        ),
    }


REPOSITORY_ERRORS = {
    400: error("a bad body, a bad artifact (the reason), or --model-control none refuses"),
    404: error("no such model in the repository"),
    405: error("--model-control none: the server's models are fixed"),
    409: error("the load would exceed --memory-budget (the reason)"),
    500: error("its workers could not load or serve the new set: rolled back (the reason)"),
    503: error("the server is draining", "retry-after?"),
}


# What a well-formed load or unload can still be refused with (400): the server's model control,
# or an artifact that fails its checks.
REPOSITORY_RULES = (r"--model-control", r"^bad artifact", r"fingerprint")


def repository_routes(f: Facts) -> dict[tuple[str, str], Route]:
    """The KServe repository extension, as tritonclient's get_model_repository_index,
    load_model and unload_model call it."""
    r = repository_schemas(f)
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
            beyond_schema=(
                *INFER_RULES,
                *needs(f, "classify"),
                *(MULTIVECTOR_INFER if "multivector" in f.tasks else ()),
                *sparse_outputs_rule(f),
            ),
            description=INFER_DESCRIPTION,
            examples={"one": INFER_EXAMPLE},
        ),
    }


# -- the request bodies: generated from their Structs (service/protocols/schemas) --------------
@functools.lru_cache(maxsize=8)
def generated(max_texts: int, max_documents: int) -> tuple[dict[str, Schema], Schema]:
    """Each body Struct's schema (a $ref) by its name in schemas.server.Bodies, and the
    components they refer to."""
    kinds = server_bodies.bodies(max_texts, max_documents)
    names = [field.name for field in dataclasses.fields(kinds)]
    refs, defs = schemas.components([getattr(kinds, name) for name in names])
    return dict(zip(names, refs, strict=True)), defs


def body(f: Facts, name: str) -> Schema:
    return generated(f.max_texts, f.max_documents)[0][name]


def generated_answers(f: Facts) -> tuple[dict[str, Schema], Schema]:
    """The answers' Structs, narrowed to the model's facts and the server's limits: each one's
    schema by name, and their components (made once a set of facts)."""
    key = (tuple(f.names), tuple(f.labels), tuple(f.tasks), f.dimension)
    return _answers(*key, f.max_texts, f.max_documents)


@functools.lru_cache(maxsize=8)
def _answers(
    names: tuple[str, ...],
    labels: tuple[str, ...],
    tasks: tuple[str, ...],
    dimension: int,
    max_texts: int,
    max_documents: int,
) -> tuple[dict[str, Schema], Schema]:
    one, batch = v1_schemas.answers(labels, max_texts)
    outputs = ("scores", "label", *(("embedding",) if "embed" in tasks else ()))
    ranks = task_schemas.rank_answers(max_documents)
    if "multivector" in tasks:  # KServe's scores alone (MaxSim); Cohere's scores unbounded
        outputs = ("scores",)
        ranks |= multivector_schemas.rank_answers(max_documents)
    outputs = sparse_terms.OUTPUTS if "sparse" in tasks else outputs
    if token_classify.TASK in tasks:  # a token classifier's per-token outputs
        outputs = kserve_tokens.OUTPUTS
    kserve_answers = kserve_structs.answers(names, VERSION, outputs, max_texts)
    parts = [
        {"classify": one, "classify_batch": batch},
        v1_schemas.model_answers(names, list(labels), list(tasks), dimension),
        ranks,
        multivector_schemas.multi_answers(names, dimension, max_texts),
        tei_structs.answers(labels, max_texts),
        {"info": tei_structs.info_answer(names)},
        task_schemas.embed_answers(names, dimension, max_texts),
        {"cohere_embed": cohere_structs.embed_answer(dimension)},
        {f"kserve_{k}": v for k, v in kserve_answers.items()},
        operator_structs.health_answers(),
        sparse_structs.answers(max_texts),
    ]
    kinds: dict[str, Any] = {}
    for part in parts:
        if kinds.keys() & part.keys():  # one name, two answers: the second would win
            raise ValueError(f"answers named twice: {sorted(kinds.keys() & part.keys())}")
        kinds |= part
    refs, defs = schemas.components(list(kinds.values()))
    return dict(zip(kinds, refs, strict=True)), defs


def answer(f: Facts, name: str) -> Schema:
    return generated_answers(f)[0][name]


def components(f: Facts) -> Schema:
    """Every Struct's schema that the document may refer to."""
    parts = [generated(f.max_texts, f.max_documents)[1], generated_answers(f)[1]]
    parts.append(token_structs.schemas(f.max_texts)[2])
    return merged([*parts, ERROR_COMPONENTS])


def merged(parts: list[Schema]) -> Schema:
    """Components from several calls of schemas.components in one: two different schemas of
    one name (two Structs of one name) are refused rather than one overwriting the other."""
    out: Schema = {}
    for part in parts:
        for name, schema in part.items():
            if out.setdefault(name, schema) != schema:
                raise ValueError(f"two different schemas are named {name}")
    return out


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
    used = referred(paths, components(f))
    if used:
        doc["components"] = {"schemas": used}
    if f.key:
        schemes = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc.setdefault("components", {})["securitySchemes"] = schemes
    return doc


def referred(tree: Any, defs: Schema) -> Schema:
    """The components that `tree` refers to, and those they refer to: a port's document holds
    only the Structs of its own routes."""
    out: Schema = {}
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(REF_PREFIX):
                name = ref[len(REF_PREFIX) :]
                if name not in out:
                    out[name] = defs[name]
                    todo.append(defs[name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return dict(sorted(out.items()))


REF_PREFIX = "#/components/schemas/"


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
