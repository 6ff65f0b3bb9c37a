"""KServe v2 / Open Inference Protocol over HTTP, as Triton serves it, so tritonclient just works.

Every loaded model by name, and by version under `/versions/{v}` (models/modelset.py finds it;
the repository extension lists, loads and unloads them through `front.repository`). What a call
means is service/kserve/'s, shared with gRPC: the inference request's Struct (bodies.py), its
reading into the job (reading.py), the answer's tensors (encoder.py), the metadata,
configuration and statistics documents (documents.py). This module is HTTP's framing of them:
the routes, the body (Content-Encoding, the JSON header and the binary tensor data after it,
`Inference-Header-Content-Length`), the deadline header, and the answers as JSON.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import unquote

import msgspec
from ringserve.service.engine.requests import Result
from ringserve.service.kserve import regions
from ringserve.service.kserve import tokens as kserve_tokens
from ringserve.service.kserve.bodies import Infer
from ringserve.service.kserve.documents import (
    config_doc,
    metadata_doc,
    repository_of,
    server_doc,
    stats_doc,
)
from ringserve.service.kserve.encoder import outputs
from ringserve.service.kserve.reading import read_job
from ringserve.service.models.info import ModelInfo
from ringserve.service.models.modelset import READY
from ringserve.service.protocols import admit, shm_regions
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.endpoint import (
    LATENCY,
    Answer,
    Endpoint,
    Facts,
    Handler,
    error,
    ok,
)
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router
from ringserve.service.protocols.schemas import S, decode_bytes
from ringserve.service.protocols.schemas.kserve import (
    RepositoryIndex,
    RepositoryLoad,
    RepositoryUnload,
)
from ringserve.service.request import prompts
from ringserve.service.request import tokens as request_tokens
from ringserve.service.request.errors import RequestError, Rule, Rules
from ringserve.service.request.lookup import find_model
from ringserve.service.views import Failure, FrontView

HEADER_LENGTH = b"inference-header-content-length"

KHandler = Callable[[FrontView, HttpProtocol, Exchange, dict[str, str]], None]


def register(router: Router) -> None:
    """KServe's routes (ROUTES, at the end), with the shared-memory extension's."""
    router.mount(ROUTES[:-3])
    shm_regions.register_routes(router)
    router.mount(ROUTES[-3:])  # the repository extension


def guard(
    server: FrontView, handler: KHandler, inference: bool = False
) -> Callable[[HttpProtocol, Exchange, dict[str, str]], None]:
    """Answer a handler's RequestError here, with the latency header every inference answer has."""

    def run(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        try:
            handler(server, conn, ex, params)
        except RequestError as exc:
            extra = (
                [latency_header(conn, ex)] if inference else None
            )  # every inference answer has it
            conn.respond_error(ex, exc.status, exc.message, extra)

    return run


def check_model(server: FrontView, params: dict[str, str]) -> ModelInfo:
    """The loaded model a path names (and its version, under /versions/{v}), else 404."""
    version = params.get("version")
    return find_model(
        server, unquote(params["model"]), None if version is None else unquote(version)
    )


def respond_json(conn: HttpProtocol, ex: Exchange, doc: Any, status: int = 200) -> None:
    conn.respond(ex, status, json.dumps(doc).encode())


# -- metadata and health --------------------------------------------------------------------------
def server_metadata(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    respond_json(conn, ex, server_doc())


def model_metadata(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    respond_json(conn, ex, metadata_doc(server, check_model(server, p)))


def model_config(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    """Triton's model configuration view, which tools such as perf_analyzer read."""
    respond_json(conn, ex, config_doc(server, check_model(server, p)))


def model_ready(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    name = check_model(server, p).name
    if server.ready():
        respond_json(conn, ex, {"name": name, "ready": True})
    else:
        conn.respond(
            ex,
            503,
            json.dumps({"name": name, "ready": False}).encode(),
            extra=[(b"retry-after", b"1")],
        )


def model_stats(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    name, version = p.get("model"), p.get("version")
    doc = stats_doc(
        server,
        None if name is None else unquote(name),
        None if version is None else unquote(version),
    )
    respond_json(conn, ex, doc)


# -- infer -------------------------------------------------------------------------------
def read_body(server: FrontView, ex: Exchange) -> bytes:
    """The request body, inflated when the client compressed it (tritonclient can)."""
    body = b"".join(ex.body)
    encoding = ex.headers.get(b"content-encoding", b"identity").strip().lower()
    if encoding == b"identity":
        return body
    if encoding not in (b"gzip", b"deflate"):
        raise RequestError(
            400, f"unsupported Content-Encoding {encoding.decode(errors='replace')!r}"
        )
    limit = server.settings.max_body
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == b"gzip" else zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)  # bounded: a small bomb stays small
    except zlib.error:
        raise RequestError(400, f"body is not valid {encoding.decode()} data") from None
    if len(data) > limit:
        raise RequestError(413, f"inflated body over {limit} bytes")
    if not inflater.eof:
        raise RequestError(400, f"truncated {encoding.decode()} body")
    return data


def split_body(server: FrontView, ex: Exchange) -> tuple[Infer, memoryview]:
    """The JSON inference header, checked whole by its Struct, and the binary tensor data
    after it."""
    body = read_body(server, ex)
    raw = ex.headers.get(HEADER_LENGTH)
    size = len(body)
    if raw is not None:
        try:
            size = int(raw)
        except ValueError:
            raise RequestError(400, "Inference-Header-Content-Length must be an integer") from None
        if not 0 <= size <= len(body):
            raise RequestError(400, "Inference-Header-Content-Length is outside the body")
    view = memoryview(body)
    return decode_bytes(view[:size], Infer, "inference header"), view[size:]


def deadline_of(ex: Exchange, timeout_us: int | None) -> int:
    """Triton's `timeout` parameter (microseconds) after the request's last byte, unless
    X-Request-Timeout-Ms says otherwise; 0: the header's, or the default (admit.submit)."""
    if timeout_us is None or b"x-request-timeout-ms" in ex.headers:
        return 0
    return ex.done_ns + timeout_us * 1000


def infer(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    info = check_model(server, params)
    header, blob = split_body(server, ex)
    job = read_job(server, info, header, blob, partial(deadline_of, ex), "kserve")

    def done(results: list[Result]) -> None:
        try:
            out = outputs(job, results)
        except RequestError as exc:  # a region unregistered meanwhile, or too small
            conn.respond_error(ex, exc.status, exc.message, [latency_header(conn, ex)])
            return
        answer: dict[str, Any] = {"model_name": info.name, "model_version": str(info.version)}
        if job.request_id is not None:
            answer["id"] = job.request_id
        if out.parameters is not None:
            answer["parameters"] = out.parameters
        answer["outputs"] = out.tensors
        head = msgspec.json.encode(answer)  # 0.3 us, against 4.4 for json.dumps
        extra = [latency_header(conn, ex)]
        if out.blobs:
            extra.append((HEADER_LENGTH, b"%d" % len(head)))
            body = b"".join([head, *out.blobs])
            conn.respond(ex, 200, body, content_type=b"application/octet-stream", extra=extra)
        else:
            conn.respond(ex, 200, head, extra=extra)

    admit.submit(server.admission, conn, ex, job.ask, done)


_pending: set[asyncio.Task[None]] = set()  # repository calls in progress (kept from the GC)


def repository_index(
    server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]
) -> None:
    """POST /v2/repository/index: tritonclient sends an empty body; `{"ready": true}` keeps
    the models that serve."""
    ready = optional_body(ex, RepositoryIndex).ready
    rows = repository_of(server).index()
    respond_json(conn, ex, [r for r in rows if r.get("state") == READY] if ready else rows)


def optional_body(ex: Exchange, kind: type[S]) -> S:
    """A body tritonclient may send empty (taken as `{}`)."""
    body = b"".join(ex.body)
    return decode_bytes(body if body.strip() else b"{}", kind)


def repository_load(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    """POST /v2/repository/models/{name}/load; parameter `version` names one (else the
    highest); Triton's `config` and `file:` overrides are not taken."""
    load = optional_body(ex, RepositoryLoad)
    given = optional_body(ex, dict[str, Any]).get("parameters") or {}  # every key, to refuse
    if "config" in given or any(k.startswith("file:") for k in given):
        raise RequestError(400, "load parameters config and file: are not supported")
    asked = load.parameters.version if load.parameters else None
    version = None if asked is None else str(asked)
    run_repository(conn, ex, repository_of(server).load(unquote(p["model"]), version))


def repository_unload(
    server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]
) -> None:
    """POST /v2/repository/models/{name}/unload (`unload_dependents` has nothing to do here)."""
    optional_body(ex, RepositoryUnload)  # unload_dependents: nothing depends on a model here
    run_repository(conn, ex, repository_of(server).unload(unquote(p["model"])))


def run_repository(conn: HttpProtocol, ex: Exchange, call: Awaitable[Failure]) -> None:
    """Answer a load or unload when it ends: 200 `{}`, or its error."""

    async def run() -> None:
        try:
            failed = await call
        except Exception as exc:  # noqa: BLE001 - answered, never left hanging
            failed = 500, f"repository call failed: {exc}"
        if failed is None:
            conn.respond(ex, 200, b"{}")
        else:
            conn.respond_error(ex, failed[0], failed[1])

    task = asyncio.get_running_loop().create_task(run())
    _pending.add(task)
    task.add_done_callback(_pending.discard)


# -- the routes -----------------------------------------------------------------------------------
def guarded(handler: KHandler, inference: bool = False) -> Callable[[FrontView], Handler]:
    return lambda server: guard(server, handler, inference)


SHM_RULES: Rules = (  # shm_regions: a region not registered, or too small
    Rule(regex=r"shared memory and (data|contents) both$"),
    Rule(regex=r"shared-memory offset or size without a region$"),
    Rule(regex=r"needs shared_memory_byte_size$"),
    regions.UNKNOWN_REGION,
    Rule(regex=r"runs past region"),
    Rule(regex=r"^output needs \d+ bytes, shared_memory_byte_size is \d+$"),
    Rule(regex=r"^BYTES tensor (data ends|element runs)"),
    Rule(regex=r"^input \w+ has shape .* but \d+ texts$"),
)
INFER_RULES: Rules = (  # what read_texts and read_outputs check across fields
    *SHM_RULES,
    Rule(regex=r"^inputs must be a list of one input"),  # "text" present, each name once
    Rule(regex=r"^input \w+ has shape .* but \d+ elements$"),
    Rule(regex=r"^input text_pair has \d+ texts, text has \d+$"),
    Rule(regex=r"^input \w+ has neither data nor binary_data_size$"),
    Rule(regex=r"^binary_data_size \d+ but \d+ bytes left$"),
    Rule(regex=r"^binary data given, but no input names it"),
    Rule(regex=r"^input text must hold 1 to \d+ texts$"),
    Rule(regex=r"^output '\w+' asked for twice$"),
    Rule(regex=r"^input data mixes rows and texts$"),
    Rule(regex=r"^unknown output '(embedding|token_\w+)': the model gives"),  # a model without
    Rule(regex=r"^unknown output '(scores|label|embedding)': the model gives token"),  # tokens'
    kserve_tokens.ONE_TEXT,
    kserve_tokens.STRIDE_TRUNCATE,
    request_tokens.STRIDE,
    prompts.UNKNOWN,
)
# A multivector model's infer scores pairs (multivector.kserve_ask): a text without its pair.
MULTIVECTOR_INFER: Rules = (
    Rule(regex=r"scores a query \(text\) against a document \(text_pair\) by MaxSim"),
    Rule(regex=r"^unknown output 'label': the model gives scores$"),
)


def model_rules(f: Facts) -> Rules:
    """What an infer call can be refused for by this model: a multivector model's pairs, and
    the outputs of another kind of model (sparse_terms.OUTPUTS are a sparse model's only)."""
    multi = MULTIVECTOR_INFER if "multivector" in f.tasks else ()
    if "sparse" in f.tasks:
        return (*multi, Rule(regex=r"^unknown output '\w+': the model gives sparse_indices"))
    return (*multi, Rule(regex=r"^unknown output 'sparse_\w+': the model gives"))


INFER_DESCRIPTION = (
    "The binary tensor data extension works both ways: a body may be the JSON header followed "
    "by tensor data, its length in Inference-Header-Content-Length (and gzip or deflate "
    "Content-Encoding); with binary outputs the answer is application/octet-stream, the "
    "header's length in Inference-Header-Content-Length."
)
INFER_EXAMPLE = {
    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a fine film"]}]
}


def model_routes(base: str) -> list[Endpoint]:
    """A model's routes under `base`: by name, or by name and version."""
    stats = "Triton's statistics of a model (all its versions) or of one version"
    not_ready = Answer("not ready", "kserve_ready", headers=("retry-after",))
    return [
        Endpoint("GET", base, guarded(model_metadata), "KServe v2 model metadata", "kserve",
                 ok("model metadata", "kserve_model"), model_path=True),
        Endpoint("GET", base + "/ready", guarded(model_ready), "KServe v2 model readiness",
                 "kserve", {**ok("ready", "kserve_ready"), 503: not_ready}, model_path=True),
        Endpoint("GET", base + "/config", guarded(model_config), "Triton's model configuration",
                 "kserve", ok("model configuration", "kserve_config"), model_path=True),
        Endpoint(
            "POST", base + "/infer", guarded(infer, inference=True), "KServe v2 inference",
            "kserve",
            ok("the outputs asked for (all of them when none is named)", "kserve_infer",
               "application/json", *LATENCY, binary=True),
            "infer", inference=True, model_path=True, needs=("classify",), rules=INFER_RULES,
            more_rules=model_rules, description=INFER_DESCRIPTION,
            examples={"one": INFER_EXAMPLE},
        ),
        Endpoint("GET", base + "/stats", guarded(model_stats), stats, "kserve",
                 ok("statistics", "kserve_stats"), model_path=True),
    ]  # fmt: skip


# What a well-formed load or unload can still be refused with (400): the server's model control,
# or an artifact that fails its checks.
REPOSITORY_RULES = (Rule(regex=r"--model-control"), Rule(regex=r"^bad artifact"),
                    Rule(regex=r"fingerprint"))  # fmt: skip
REPOSITORY_ERRORS = {
    400: error("a bad body, a bad artifact (the reason), or --model-control none refuses"),
    404: error("no such model in the repository"),
    405: error("--model-control none: the server's models are fixed"),
    409: error("the load would exceed --memory-budget (the reason)"),
    500: error("its workers could not load or serve the new set: rolled back (the reason)"),
    503: error("the server is draining", "retry-after?"),
}
DONE = {
    **REPOSITORY_ERRORS,
    **ok("done: the model serves (load) or is gone (unload)", "kserve_done"),
}
ROUTES = [
    Endpoint("GET", "/v2", guarded(server_metadata), "KServe v2 server metadata", "kserve",
             ok("server metadata", "kserve_server")),
    *model_routes("/v2/models/{model}"),
    *model_routes("/v2/models/{model}/versions/{version}"),
    Endpoint("GET", "/v2/models/stats", guarded(model_stats),
             "Triton's statistics of every model", "kserve", ok("statistics", "kserve_stats")),
    # The repository extension, as tritonclient's get_model_repository_index, load_model and
    # unload_model call it
    Endpoint("POST", "/v2/repository/index", guarded(repository_index),
             "Every model of the repository, loaded or not (an empty body is taken)", "kserve",
             ok("one row a (name, version)", "kserve_rows"), "repository_index",
             body_optional=True),
    Endpoint("POST", "/v2/repository/models/{model}/load", guarded(repository_load),
             "Load a model (answered once it serves)", "kserve", DONE, "repository_load",
             repository_path=True, rules=REPOSITORY_RULES, body_optional=True),
    Endpoint("POST", "/v2/repository/models/{model}/unload", guarded(repository_unload),
             "Unload a model (answered once what was admitted for it is answered)", "kserve",
             DONE, "repository_unload", repository_path=True, rules=REPOSITORY_RULES,
             body_optional=True),
]  # fmt: skip
