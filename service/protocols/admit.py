"""HTTP's side of admission, for our /v1 routes and KServe: a request's deadline, priority and
trace from its headers, then the engine's `Admission`; and the answers to a refusal (429, 503)
or to a failed text (413, 500, 503, 504)."""

from __future__ import annotations

from collections.abc import Callable

from ringserve.service.engine.admission import (
    STATUS_HTTP,
    STATUS_MESSAGE,
    Admission,
    Refusal,
    Trace,
    Tracer,
    first_failure,
    too_long,
)
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.engine.tenants import PRIORITY_NAMES, Tenant
from ringserve.service.protocols.errors import error_body
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.request.errors import RequestError
from ringserve.service.request.options import asked_priority
from ringserve.shm import layout as L

RETRY_AFTER = [(b"retry-after", b"1")]


def latency_header(conn: HttpProtocol, ex: Exchange) -> tuple[bytes, bytes]:
    """X-Latency-Ms: from the request's last byte to now, both read on the connection's clock,
    which app.py makes the dispatcher's (tests drive a fake one)."""
    return (b"x-latency-ms", b"%.1f" % ((conn.clock() - ex.done_ns) / 1e6))


def respond_failure(conn: HttpProtocol, ex: Exchange, failed: Result) -> None:
    status = STATUS_HTTP.get(failed.status, 500)
    extra = [latency_header(conn, ex)]
    if status == 503:
        extra += RETRY_AFTER
    if failed.status == L.STATUS_TOO_LONG:  # the counts as fields too, for programs
        message, counts = too_long(failed)
        body = error_body(ex.url, 413, message, **counts)
        conn.respond(ex, 413, body, extra=extra)
        return
    conn.respond_error(ex, status, STATUS_MESSAGE.get(failed.status, "internal error"), extra)


def respond_refusal(conn: HttpProtocol, ex: Exchange, refusal: Refusal) -> None:
    """404 for a model not open, 429 over the key's rate or 503 from the queue, with the
    seconds until a retry fits (none for a 404)."""
    extra = [latency_header(conn, ex)]
    if refusal.retry_after_s:
        extra.append((b"retry-after", str(refusal.retry_after_s).encode()))
    conn.respond_error(ex, refusal.code, refusal.message, extra)


def deadline_ns(ex: Exchange, timeout_s: float) -> int:
    """The request's own X-Request-Timeout-Ms after its last byte, else the default."""
    raw = ex.headers.get(b"x-request-timeout-ms")
    if raw is not None:
        try:
            ms = float(raw)
        except ValueError:
            raise RequestError(400, "X-Request-Timeout-Ms must be a number") from None
        if not ms > 0 or ms > 86_400_000:
            raise RequestError(400, "X-Request-Timeout-Ms must be in (0, 86400000]")
        timeout_s = ms / 1000
    return ex.done_ns + int(timeout_s * 1e9)


def submit(
    admission: Admission,
    conn: HttpProtocol,
    ex: Exchange,
    ask: Ask,
    on_ok: Callable[[list[Result]], None],
) -> None:
    """Admit an HTTP request's ask, or answer 404, 429, 503 or 504 at once. The headers fill
    what its body left unset: the deadline (X-Request-Timeout-Ms after the request's last
    byte, else the default) and the priority (X-Priority); neither raises the key's priority.
    `on_ok` gets the results when every text succeeded; any failure is answered here."""
    if not ask.deadline:
        ask.deadline = deadline_ns(ex, admission.timeout_s)
    if ask.priority is None:
        ask.priority = asked_priority(ex.headers.get(b"x-priority"), "X-Priority")
    tenant: Tenant | None = ex.tenant
    trace = None
    if admission.tracing is not None:
        level = admission.level(tenant, ask.priority, ask.model)
        trace = ex.trace = start_trace(admission.tracing, ex, ask, tenant, level)

    def done(results: list[Result]) -> None:
        failed = first_failure(results)
        if failed is None:
            on_ok(results)
        else:
            respond_failure(conn, ex, failed)

    ex.model = admission.dispatcher.names.get(ask.model, "")  # the answer is counted under it
    refusal = admission.submit(ask, done, tenant, trace, conn.client)
    if refusal is not None:
        respond_refusal(conn, ex, refusal)


def start_trace(
    tracing: Tracer, ex: Exchange, ask: Ask, tenant: Tenant | None, level: int
) -> Trace | None:
    path = ex.url.split(b"?", 1)[0].decode("utf-8", "replace")
    method = ex.method.decode("latin-1")
    attrs = {
        "http.request.method": method,
        "url.path": path,
        "ringserve.task": ask.task,
        "ringserve.priority": PRIORITY_NAMES[level],
        "ringserve.request_id": ex.request_id.decode("latin-1"),
    }
    if tenant is not None:
        attrs["ringserve.tenant"] = tenant.name
    return tracing.start(
        f"{method} {path}",
        ask.protocol,
        ex.done_ns,
        ex.headers.get(b"traceparent"),
        ex.headers.get(b"tracestate"),
        attrs,
    )
