"""Triton's system shared-memory extension over HTTP: `POST /v2/systemsharedmemory/region/{name}/
register` (`{"key", "offset", "byte_size"}`), `POST /v2/systemsharedmemory[/region/{name}]/
unregister`, `GET /v2/systemsharedmemory[/region/{name}]/status`, into the one registry HTTP and
gRPC share (service/kserve/regions.py, which says what a region is and how it is read)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from ringserve.service.kserve.regions import NO_CUDA, REGIONS, REGISTER_RULES, UNKNOWN_REGION
from ringserve.service.protocols.endpoint import Endpoint, Handler, error, ok
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router
from ringserve.service.protocols.schemas import decode
from ringserve.service.protocols.schemas.kserve import RegisterRegion
from ringserve.service.request.errors import RequestError, Rule

CUDA_REFUSED = Rule(NO_CUDA)  # HTTP's register (gRPC's answers NO_CUDA too: rpc/triton.py)


def register_routes(router: Router) -> None:
    """The extension's HTTP routes (Triton's paths; bodies as tritonclient sends them)."""
    router.mount(ROUTES)


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
    raise RequestError(400, CUDA_REFUSED.say())


BASE, CUDA = "/v2/systemsharedmemory", "/v2/cudasharedmemory"
STATUS = ok("the registered regions", "kserve_regions")
DONE = ok("done", "kserve_done")


def serve(handler: Callable[[Exchange, str | None], Any]) -> Callable[[Any], Handler]:
    return lambda _: answered(handler)


# CUDA shared memory: none is ever registered, so "unregister all" (clients clean up with it) has
# nothing to do, the status is empty, and a register says why not.
ROUTES = [
    Endpoint("GET", BASE + "/status", serve(http_status), "Every registered region", "kserve",
             STATUS),
    Endpoint("GET", BASE + "/region/{region}/status", serve(http_status),
             "One registered region", "kserve", STATUS, rules=(UNKNOWN_REGION,)),
    Endpoint("POST", BASE + "/region/{region}/register", serve(http_register),
             "Map a region of a POSIX shared-memory object (the client's: never unlinked)",
             "kserve", DONE, "register_region", rules=REGISTER_RULES),
    Endpoint("POST", BASE + "/unregister", serve(http_unregister), "Unmap every region",
             "kserve", DONE, body_optional=True),
    Endpoint("POST", BASE + "/region/{region}/unregister", serve(http_unregister),
             "Unmap a region (an unknown one is no error)", "kserve", DONE, body_optional=True),
    Endpoint("GET", CUDA + "/status", serve(lambda ex, region: []),
             "CUDA shared memory: none is served, so none is registered", "kserve",
             ok("[]", "kserve_regions")),
    Endpoint("POST", CUDA + "/unregister", serve(lambda ex, region: {}),
             "CUDA shared memory: nothing to unregister", "kserve", DONE, body_optional=True),
    Endpoint("POST", CUDA + "/region/{region}/register", serve(cuda_register),
             "CUDA shared memory is not served: always 400", "kserve",
             {400: error("CUDA shared memory is not served")}, "anything",
             rules=(CUDA_REFUSED,)),
]  # fmt: skip
