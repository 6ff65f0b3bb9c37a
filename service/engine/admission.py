"""Admission for every protocol: the dispatcher's queue bound, deadlines, and the refusal and
failure answers an HTTP or KServe request gets (the binary protocol maps the same statuses).

It knows the dispatcher and the settings, and asks the server only why it refuses; it never
sees the server itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ringserve.service.engine.dispatcher import Dispatcher, Result
from ringserve.service.engine.tenants import (
    INTERACTIVE,
    PRIORITIES,
    PRIORITY_NAMES,
    KeyRing,
    Tenant,
)
from ringserve.service.protocols.http import Exchange, HttpError, HttpProtocol
from ringserve.service.settings import Config
from ringserve.shm import layout as L

if TYPE_CHECKING:
    from ringserve.service.ops.tracing import RequestTrace, Tracing

STATUS_HTTP = {
    L.STATUS_OK: 200,
    L.STATUS_BAD_REQUEST: 400,
    L.STATUS_OVERLOADED: 503,
    L.STATUS_DEADLINE: 504,
    L.STATUS_INTERNAL: 500,
    L.STATUS_TOO_LONG: 413,
    L.STATUS_RATE_LIMITED: 429,
}
STATUS_MESSAGE = {
    L.STATUS_BAD_REQUEST: "text is empty or not valid UTF-8",
    L.STATUS_OVERLOADED: "overloaded",
    L.STATUS_DEADLINE: "request deadline passed",
    L.STATUS_INTERNAL: "internal error",
}
RETRY_AFTER = [(b"retry-after", b"1")]


def latency_header(ex: Exchange) -> tuple[bytes, bytes]:
    return (b"x-latency-ms", b"%.1f" % ((time.monotonic_ns() - ex.done_ns) / 1e6))


def first_failure(results: list[Result]) -> Result | None:
    for r in results:
        if r.status != L.STATUS_OK:
            return r
    return None


def too_long(failed: Result) -> tuple[str, dict[str, int]]:
    """The message and fields of a 413 for a text over the model's max_length."""
    if failed.flags & L.RSP_WINDOWED:
        if not failed.windows:
            msg = f"text pair has {failed.tokens} tokens, and its first text leaves no room "
            return msg + "for windows of the second", {"tokens": failed.tokens}
        msg = (
            f"text has {failed.tokens} tokens: {failed.windows} windows, over --max-windows "
            f"{failed.limit}"
        )
        return msg, {
            "tokens": failed.tokens,
            "windows": failed.windows,
            "max_windows": failed.limit,
        }
    msg = f"text has {failed.tokens} tokens, over the model's max_length of {failed.limit}"
    return msg + " (truncate: false)", {"tokens": failed.tokens, "max_length": failed.limit}


def failure(failed: Result) -> tuple[int, str]:
    """The HTTP status and message of a failed text, for every protocol that maps them."""
    if failed.status == L.STATUS_TOO_LONG:
        return 413, too_long(failed)[0]
    return STATUS_HTTP.get(failed.status, 500), STATUS_MESSAGE.get(failed.status, "internal error")


def respond_failure(conn: HttpProtocol, ex: Exchange, failed: Result) -> None:
    status = STATUS_HTTP.get(failed.status, 500)
    extra = [latency_header(ex)]
    if status == 503:
        extra += RETRY_AFTER
    if failed.status == L.STATUS_TOO_LONG:  # the counts as fields too, for programs
        message, counts = too_long(failed)
        body = json.dumps({"error": message, **counts}).encode()
        conn.respond(ex, 413, body, extra=extra)
        return
    conn.respond_error(ex, status, STATUS_MESSAGE.get(failed.status, "internal error"), extra)


def asked_priority(value: object, where: str) -> int | None:
    """A request's own priority: `interactive` or `bulk` (X-Priority, KServe `priority`);
    KServe's integer levels as Triton reads them (1 the highest: interactive; 2 and more:
    bulk; 0: the key's own)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, bool):
        raise HttpError(400, f"{where} must be interactive or bulk")
    if isinstance(value, int):
        if value < 0:
            raise HttpError(400, f"{where} must be interactive, bulk, or a level 0 and up")
        return None if value == 0 else min(value - 1, 1)
    if isinstance(value, str) and value.strip().lower() in PRIORITIES:
        return PRIORITIES[value.strip().lower()]
    raise HttpError(400, f"{where} must be interactive or bulk")


def rate_limited(conn: HttpProtocol, ex: Exchange, tenant: Tenant) -> None:
    """429 for a key over its rate, with the seconds until its next request fits."""
    retry = tenant.retry_after_s()
    extra = [latency_header(ex), (b"retry-after", str(retry).encode())]
    conn.respond_error(ex, 429, f"over the key's rate of {tenant.rate:g} requests/s", extra)


class Admission:
    """Admits texts to the dispatcher, or refuses them at once with the reason: the key's
    rate (429), then the queue (503). Starts the request's trace when tracing is on."""

    def __init__(
        self, dispatcher: Dispatcher, settings: Config, refusal: Callable[[], str]
    ) -> None:
        self.dispatcher = dispatcher
        self.settings = settings
        self.refusal = refusal  # why the dispatcher refuses now: draining, full, no worker
        self.keys: KeyRing | None = None  # set by the server with --api-key(s)
        self.tracing: Tracing | None = None  # set by the server when tracing is on

    def deadline_ns(self, ex: Exchange) -> int:
        """The request's own X-Request-Timeout-Ms after its last byte, else the default."""
        raw = ex.headers.get(b"x-request-timeout-ms")
        timeout_s = self.settings.request_timeout_s
        if raw is not None:
            try:
                ms = float(raw)
            except ValueError:
                raise HttpError(400, "X-Request-Timeout-Ms must be a number") from None
            if not ms > 0 or ms > 86_400_000:
                raise HttpError(400, "X-Request-Timeout-Ms must be in (0, 86400000]")
            timeout_s = ms / 1000
        return ex.done_ns + int(timeout_s * 1e9)

    def submit(
        self,
        conn: HttpProtocol,
        ex: Exchange,
        texts: list[bytes],
        on_ok: Callable[[list[Result]], None],
        protocol: str,
        deadline: int | None = None,
        task: str = "classify",
        priority: int | None = None,
    ) -> None:
        """Admit texts for inference, or answer 429 or 503 at once. `deadline` overrides the
        header's, `priority` (a KServe parameter) the X-Priority header's; neither raises the
        key's priority. `on_ok` gets the results when every text succeeded; any failure is
        answered here."""
        if deadline is None:
            deadline = self.deadline_ns(ex)
        if priority is None:
            priority = asked_priority(ex.headers.get(b"x-priority"), "X-Priority")
        tenant: Tenant | None = ex.tenant
        level = tenant.priority_for(priority) if tenant is not None else priority or INTERACTIVE
        now = self.dispatcher.clock()
        trace = None
        if self.tracing is not None:
            trace = ex.trace = self.start_trace(ex, protocol, task, tenant, level)
        if tenant is not None and not tenant.take(now):
            if self.keys is not None:
                self.keys.counts(tenant.name).limited += 1
            if trace is not None:
                trace.refused(now, "rate_limited")
            rate_limited(conn, ex, tenant)
            return

        def done(results: list[Result]) -> None:
            if trace is not None:
                trace.answered(results, self.dispatcher.clock())
            failed = first_failure(results)
            if failed is None:
                on_ok(results)
            else:
                respond_failure(conn, ex, failed)

        name = tenant.name if tenant is not None else ""
        d = self.dispatcher
        admitted = d.clock()  # before submit: a worker may start on the texts before it returns
        if not d.submit(texts, deadline, done, protocol, task, level, name):
            if trace is not None:
                trace.refused(d.clock(), "overloaded")
            extra = [latency_header(ex), *RETRY_AFTER]
            conn.respond_error(ex, 503, self.refusal(), extra)
            return
        if self.keys is not None and tenant is not None:
            self.keys.admitted(name, len(texts), level)
        if trace is not None:
            trace.admitted(admitted, len(texts), sum(len(t) for t in texts))

    def start_trace(
        self, ex: Exchange, protocol: str, task: str, tenant: Tenant | None, level: int
    ) -> RequestTrace | None:
        assert self.tracing is not None
        path = ex.url.split(b"?", 1)[0].decode("utf-8", "replace")
        method = ex.method.decode("latin-1")
        attrs = {
            "http.request.method": method,
            "url.path": path,
            "ringserve.task": task,
            "ringserve.priority": PRIORITY_NAMES[level],
            "ringserve.request_id": ex.request_id.decode("latin-1"),
        }
        if tenant is not None:
            attrs["ringserve.tenant"] = tenant.name
        return self.tracing.start(
            f"{method} {path}",
            protocol,
            ex.done_ns,
            ex.headers.get(b"traceparent"),
            ex.headers.get(b"tracestate"),
            attrs,
        )
