"""Triton's system shared-memory extension over HTTP: `POST /v2/systemsharedmemory/region/{name}/
register` (`{"key", "offset", "byte_size"}`), `POST /v2/systemsharedmemory[/region/{name}]/
unregister`, `GET /v2/systemsharedmemory[/region/{name}]/status`, into the one registry HTTP and
gRPC share (service/kserve/regions.py, which says what a region is and how it is read)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from ringserve.service.kserve.regions import NO_CUDA, REGIONS
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Handler, Router
from ringserve.service.protocols.schemas import decode
from ringserve.service.protocols.schemas.kserve import RegisterRegion
from ringserve.service.request.errors import RequestError


def register_routes(router: Router) -> None:
    """The extension's HTTP routes (Triton's paths; bodies as tritonclient sends them)."""
    base = "/v2/systemsharedmemory"
    router.add("GET", base + "/status", answered(http_status))
    router.add("GET", base + "/region/{region}/status", answered(http_status))
    router.add("POST", base + "/region/{region}/register", answered(http_register))
    router.add("POST", base + "/unregister", answered(http_unregister))
    router.add("POST", base + "/region/{region}/unregister", answered(http_unregister))
    # CUDA shared memory: none is ever registered, so "unregister all" (clients clean up with it)
    # has nothing to do, the status is empty, and a register says why not.
    cuda = "/v2/cudasharedmemory"
    router.add("GET", cuda + "/status", answered(lambda ex, region: []))
    router.add("POST", cuda + "/unregister", answered(lambda ex, region: {}))
    router.add("POST", cuda + "/region/{region}/register", answered(cuda_register))


def answered(handler: Callable[[Exchange, str | None], Any]) -> Handler:
    """A handler's result as the JSON answer, its RequestError as the error answer."""

    def run(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        region = params.get("region")
        try:
            doc = handler(ex, None if region is None else unquote(region))
        except RequestError as exc:
            conn.respond_error(ex, exc.status, exc.message)
            return
        conn.respond(ex, 200, json.dumps(doc).encode())

    return run


def http_status(ex: Exchange, region: str | None) -> list[dict[str, Any]]:
    return REGIONS.status(region)


def http_register(ex: Exchange, region: str | None) -> dict[str, Any]:
    body = decode(ex, RegisterRegion)
    REGIONS.register(region or "", body.key, body.offset, body.byte_size)
    return {}


def http_unregister(ex: Exchange, region: str | None) -> dict[str, Any]:
    REGIONS.unregister(region)
    return {}


def cuda_register(ex: Exchange, region: str | None) -> dict[str, Any]:
    raise RequestError(400, NO_CUDA)
