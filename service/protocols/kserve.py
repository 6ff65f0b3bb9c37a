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
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router
from ringserve.service.protocols.schemas import S, decode_bytes
from ringserve.service.protocols.schemas.kserve import (
    RepositoryIndex,
    RepositoryLoad,
    RepositoryUnload,
)
from ringserve.service.request.errors import RequestError
from ringserve.service.request.lookup import find_model
from ringserve.service.views import Failure, FrontView

HEADER_LENGTH = b"inference-header-content-length"

KHandler = Callable[[FrontView, HttpProtocol, Exchange, dict[str, str]], None]


def register(router: Router) -> None:
    server = router.server
    router.add("GET", "/v2", guard(server, server_metadata))
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        router.add("GET", base, guard(server, model_metadata))
        router.add("GET", base + "/ready", guard(server, model_ready))
        router.add("GET", base + "/config", guard(server, model_config))
        router.add("POST", base + "/infer", guard(server, infer, inference=True))
        router.add("GET", base + "/stats", guard(server, model_stats))
    router.add("GET", "/v2/models/stats", guard(server, model_stats))
    shm_regions.register_routes(router)
    router.add("POST", "/v2/repository/index", guard(server, repository_index))
    router.add("POST", "/v2/repository/models/{model}/load", guard(server, repository_load))
    router.add("POST", "/v2/repository/models/{model}/unload", guard(server, repository_unload))


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
