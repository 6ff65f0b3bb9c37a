"""HTTP/1.1 on an asyncio Protocol with the httptools parser: keep-alive, pipelining, limits.

State is grouped by lifetime: the server (HttpServerState, shared), the connection (this
protocol object), the request (Exchange). Answers go out in request order, as pipelining needs.
Routing lives in service.routes; this module only frames requests and answers.

The edges (docs/api.md, "HTTP/1.1"): trailers are read and dropped, never merged into the
headers; a chunked body counts as sent (its size lines, any extensions and trailers with its
data) against --max-body; a client that shuts its sending side after its requests (a half-close)
still gets its answers, and one that closed its socket is told from it by a `100 Continue`
written after its EOF, which a closed socket answers with a reset (`peers.peer_gone`); idle
time counts from the last answer, and every kept-alive answer says `keep-alive: timeout=N`
(an HTTP/1.0 client's `connection: keep-alive` is echoed). At the cap (--max-connections) a
client address gets its share (`peers.Seats`); a lost connection's texts still waiting for a
worker are dropped (`leave`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, cast

import httptools
from ringserve.service.config.settings import Config
from ringserve.service.engine.clients import Client
from ringserve.service.protocols.errors import error_body as shaped_error
from ringserve.service.protocols.hosts import HostCheck
from ringserve.service.protocols.peers import Seats, check_soon, peer_gone, peer_of
from ringserve.service.protocols.readgate import (
    DRAINING,
    EOF,
    LOST,
    PIPELINE_FULL,
    WRITE_BLOCKED,
    ReadGate,
)
from ringserve.service.request.errors import RequestError

REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
MAX_PIPELINE = 64  # answers owed on one connection before its reading pauses
# The parser is fed SLICE bytes at a time, and the slices of one read stop for the loop's turn
# once REQUESTS_PER_TURN requests are framed (so at most that and one slice's worth of the
# smallest requests, about 110). A body may come in BODY_PIECES pieces of any size, past that
# of MIN_PIECE bytes on average (a chunked body of 1-byte chunks costs a parser callback each).
REQUESTS_PER_TURN, SLICE = 32, 2048
BODY_PIECES, MIN_PIECE = 1024, 64
# After a client's EOF with answers owed: an interim answer every HTTP/1.1 client skips.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")
_ID_PREFIX = os.urandom(4).hex()
log = logging.getLogger("ringserve.http")


class Exchange:
    """One request and, once ready, its answer."""

    __slots__ = (
        "body",
        "done_ns",
        "headers",
        "http10",
        "keep_alive",
        "method",
        "model",
        "request_id",
        "response",
        "status",
        "tenant",
        "trace",
        "url",
    )

    def __init__(self) -> None:
        self.method = b""
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.request_id = b""
        self.keep_alive = True
        self.http10 = False  # an HTTP/1.0 request: a kept-alive answer says so
        self.done_ns = 0  # monotonic ns of the last byte received
        self.response: bytes | None = None
        self.status = 0  # of the response, once there is one
        self.tenant: Any = None  # service.tenants.Tenant of the caller's key (None: no key)
        self.trace: Any = None  # service.tracing.RequestTrace while a sampled request is traced
        self.model = ""  # the name of the model it was admitted for (metrics' model label)


class Clients(Protocol):
    """What a connection's end tells the engine of its client (engine.admission.Admission)."""

    def leave(self, client: Client) -> object: ...  # lost: its waiting texts are dropped
    def behind(self, client: Client) -> object: ...  # EOF: its waiting texts wait behind


class HttpServerState:
    """What every connection of one server shares."""

    def __init__(
        self,
        settings: Config,
        router: Callable[[HttpProtocol, Exchange], None],
        count: Callable[..., None],
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.settings = settings
        self.router = router
        self.clock = clock  # every timeout reads this one clock (tests drive a fake one)
        # Every answer written, by protocol, status, tenant and model (requests_total):
        # count(protocol, code, n=1, tenant=None, model="").
        self.count = count
        self.connections: set[HttpProtocol] = set()
        self.seats = Seats(settings.max_connections)  # the cap, shared out by client address
        self.counter = 0
        self.stopping = False  # the stop began: a 503 closes its connection (a retry goes on)
        self.closing = False  # draining: every connection closes after what it owes
        self.refused = 0
        self.access_log: Callable[[Exchange, int], None] | None = None  # --access-log 1
        self.hosts: HostCheck | None = None  # --allowed-hosts (None: every Host and Origin)
        self.clients: Clients | None = None  # the admission: what a client's end changes
        timeout = max(1, int(settings.keepalive_timeout_s))
        self.alive = b"keep-alive: timeout=%d" % timeout  # said on every kept-alive answer
        self.alive10 = b"connection: keep-alive\r\n" + self.alive  # to an HTTP/1.0 client

    def refuse(self, transport: asyncio.Transport) -> None:
        """A connection over --max-connections (and no share to make room): 503 and close."""
        self.refused += 1
        body = error_body("too many connections")
        extra = [(b"retry-after", b"1")]
        transport.write(build_response(503, body, self.new_request_id(), extra=extra,
                                       keep_alive=False))  # fmt: skip
        transport.close()
        self.count("http", 503)

    def begin_drain(self) -> None:
        """Idle connections close now, as uvicorn and Go's Shutdown close theirs; one with
        answers owed closes after the last, and one in the middle of a request serves it, then
        closes. A request that races the close of an idle connection is the client's to retry
        (the keep-alive race every HTTP client handles; --shutdown-delay-s keeps it rare)."""
        self.closing = True
        for conn in list(self.connections):
            conn.end.drain()

    def frame_read(self) -> None:
        """Frame and route every request already read but waiting for the loop's next turn,
        now (the stop: what was read before the signal is admitted before it counts)."""
        for conn in list(self.connections):
            conn.end.frame_read()

    def owed(self) -> bool:
        """Some connection has an answer to write, or is reading a request."""
        return any(c.queue or c.started_ns for c in self.connections if not c.closing)

    def new_request_id(self) -> bytes:
        self.counter += 1
        return f"{_ID_PREFIX}-{self.counter:x}".encode()


def build_response(
    status: int,
    body: bytes,
    request_id: bytes,
    content_type: bytes = b"application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
    keep_alive: bool = True,
    alive: bytes = b"",
) -> bytes:
    """An answer's bytes; `alive`: the header lines a kept-alive answer carries."""
    lines = [
        b"HTTP/1.1 %d %s" % (status, REASONS.get(status, "Unknown").encode()),
        b"content-type: " + content_type,
        b"content-length: %d" % len(body),
        b"x-request-id: " + request_id,
    ]
    if extra:
        lines.extend(name + b": " + value for name, value in extra)
    if not keep_alive:
        lines.append(b"connection: close")
    elif alive:
        lines.append(alive)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def closing_answer(response: bytes) -> bytes:
    """A kept-alive answer made the connection's last: `connection: close` in place of the
    keep-alive lines (the end was decided after the answer was built)."""
    head, sep, body = response.partition(b"\r\n\r\n")
    lines = [
        ln for ln in head.split(b"\r\n") if not ln.startswith((b"connection:", b"keep-alive:"))
    ]
    return b"\r\n".join(lines) + b"\r\nconnection: close" + sep + body


def protocol_of(url: bytes) -> str:
    """The label an answer is counted under: KServe v2 owns every /v2 path but Cohere's."""
    cohere = url.startswith((b"/v2/embed", b"/v2/rerank"))
    return "kserve" if url.startswith(b"/v2") and not cohere else "http"


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class RequestReader:
    """The parser's side of one connection: httptools calls these as it frames each request, and
    the limits on a head, a body and the pieces a body comes in are checked here (a body of
    many tiny chunks costs a callback each: past BODY_PIECES, their mean must be at least
    MIN_PIECE bytes). A body is also measured as sent (`wire_body`: its chunk-size lines, their
    extensions and its trailers with its data, counted a slice at a time), so what the parser
    reads past without a callback still counts toward --max-body. Trailers are never headers.
    Each whole request goes to the connection (`HttpProtocol.received`)."""

    def __init__(self, conn: HttpProtocol) -> None:
        self.conn = conn
        self.settings = conn.settings
        self.parser = httptools.HttpRequestParser(self)
        self.current: Exchange | None = None
        self.head_bytes = 0  # of the request head being parsed
        self.raw_head_bytes = 0  # bytes received while a head is incomplete
        self.body_bytes = 0
        self.body_pieces = 0
        self.wire_body = 0  # bytes of the slices fed while the body was being read
        self.in_head = False
        self.requests = 0  # framed in this loop turn

    def feed(self, data: bytes) -> bool:
        """Frame what `data` completes; False once the connection failed (read no more)."""
        if not self.current or self.in_head:
            self.raw_head_bytes += len(data)
        else:  # a body: its bytes count as sent (a slice may end in the next request's)
            self.wire_body += len(data)
            if self.wire_body > self.settings.max_body + SLICE:
                self.conn.end.fail(413, f"body over {self.settings.max_body} bytes as sent")
                return False
        try:
            self.parser.feed_data(data)
        except RequestError as exc:
            self.conn.end.fail(exc.status, exc.message)
        except httptools.HttpParserUpgrade:
            if self.current is None:  # CONNECT or Upgrade: the request itself is answered
                self.conn.end.after_owed()
            else:
                self.conn.end.fail(400, "protocol upgrade is not supported")
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, RequestError):
                self.conn.end.fail(cause.status, cause.message)
            else:
                self.conn.end.fail(400, "malformed HTTP request")
        except httptools.HttpParserError as exc:
            self.conn.end.fail(400, f"malformed HTTP request: {exc}")
        else:
            if self.raw_head_bytes > self.settings.max_head * 2 + 65536:
                self.conn.end.fail(431, "request head too large")
        return not self.conn.gate.done

    def on_message_begin(self) -> None:
        self.current = Exchange()
        self.in_head = True
        self.head_bytes = self.body_bytes = self.body_pieces = 0
        if not self.conn.started_ns:
            self.conn.started_ns = self.conn.clock()

    def on_url(self, url: bytes) -> None:
        assert self.current is not None
        self.current.url += url
        self.head_bytes += len(url)
        if self.head_bytes + 16 > self.settings.max_head:
            raise RequestError(431, "request head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.current is not None
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes + 16 > self.settings.max_head:
            raise RequestError(431, "request head too large")
        if self.in_head:  # after the head, a chunked body's trailer: read, never a header
            self.current.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        ex = self.current
        assert ex is not None
        self.in_head = False
        self.raw_head_bytes = self.wire_body = 0
        ex.method = self.parser.get_method()
        ex.keep_alive = bool(self.parser.should_keep_alive())
        ex.http10 = self.parser.get_http_version() == "1.0"
        rid = ex.headers.get(b"x-request-id")
        ex.request_id = rid if rid and _REQUEST_ID.match(rid) else self.conn.state.new_request_id()
        length = ex.headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                raise RequestError(400, "invalid Content-Length") from None
            if declared > self.settings.max_body:
                raise RequestError(413, f"body over {self.settings.max_body} bytes")
        transport = self.conn.transport
        if ex.headers.get(b"expect", b"").lower() == b"100-continue" and transport:
            transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        assert self.current is not None
        self.body_bytes += len(body)
        self.body_pieces += 1
        if self.body_bytes > self.settings.max_body:
            raise RequestError(413, f"body over {self.settings.max_body} bytes")
        if self.body_pieces > BODY_PIECES and self.body_bytes < MIN_PIECE * self.body_pieces:
            raise RequestError(400, f"body in pieces of under {MIN_PIECE} bytes on average")
        self.current.body.append(body)

    def on_message_complete(self) -> None:
        ex = self.current
        assert ex is not None
        self.current = None
        self.requests += 1
        self.conn.received(ex)


class HttpProtocol(asyncio.Protocol):
    """One connection: its life, its requests framed (what its read gate lets in: answers owed,
    the loop's turns), and its answers, written in request order. Its timeouts and its end are
    `Ending`'s."""

    def __init__(self, state: HttpServerState) -> None:
        self.state = state
        self.settings = state.settings
        self.transport: asyncio.Transport | None = None
        self.reader = RequestReader(self)
        self.queue: deque[Exchange] = deque()  # answers owed, in request order
        self.started_ns = 0  # when the request being read began (0 = between requests)
        self.clock = state.clock
        self.last_active_ns = self.clock()  # its last request byte or answer
        self.ending = False  # close once nothing more is owed (drain, EOF, upgrade)
        # Why it is not read; `done` once nothing more is framed (a request that could not be
        # framed, the drain, EOF, closed).
        self.gate = ReadGate(REQUESTS_PER_TURN, self.feed_backlog, self.read_again)
        self.write_blocked_ns = 0  # when the transport last asked us to pause
        self.backlog = b""  # read, not yet framed: waits for the loop's next turn
        self.framing = False  # Ending.frame_read is framing the backlog: answers wait for it
        self.peer = ""  # the client's address (peers.peer_of)
        self.client = Client()  # its texts in the queue: its share, and dropped when it goes
        self.end = Ending(self)

    # -- connection -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.peer = peer_of(transport)
        if not self.state.seats.take(self):
            # A connection accepted while draining is served (its answer closes it); only the
            # connection limit refuses one.
            self.state.refuse(self.transport)
            self.gate.pause(LOST)
            return
        self.gate.attach(self.transport)
        self.state.connections.add(self)
        self.ending = self.state.closing

    @property
    def closing(self) -> bool:
        """Its transport is closed or closing: nothing more is written."""
        return self.gate.lost

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections.discard(self)
        self.state.seats.leave(self)
        self.gate.pause(LOST)
        if self.client.texts and self.state.clients is not None:  # nobody reads these answers
            self.state.clients.leave(self.client)
        self.queue.clear()
        self.backlog = b""

    def eof_received(self) -> bool | None:
        return self.end.eof()

    def idle_since(self) -> float | None:
        """When it last did anything, if it owes nothing now (peers.Seats)."""
        busy = self.queue or self.started_ns or self.backlog or self.closing
        return None if busy else self.last_active_ns

    def evict(self) -> None:
        """Closed, idle, to seat another client (peers.Seats)."""
        self.gate.pause(LOST)
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        self.write_blocked_ns = self.clock()
        self.gate.pause(WRITE_BLOCKED)

    def resume_writing(self) -> None:
        self.gate.resume(WRITE_BLOCKED)

    def read_again(self) -> None:
        """Reading resumed: the wait was ours, not the client's, so its read clock restarts."""
        if self.started_ns:
            self.started_ns = self.clock()

    def data_received(self, data: bytes) -> None:
        if self.gate.done:
            return
        self.last_active_ns = now = self.clock()
        if not self.started_ns:
            self.started_ns = now
        self.feed(data)

    def feed(self, data: bytes) -> None:
        """Frame `data` in slices; once REQUESTS_PER_TURN requests are framed, the rest waits
        for the loop's next turn (the socket unread), so pipelined junk cannot hold the loop."""
        reader = self.reader
        reader.requests = 0
        for pos in range(0, len(data), SLICE):
            piece = data if len(data) <= SLICE else data[pos : pos + SLICE]
            if not reader.feed(piece):
                return
            if reader.requests >= self.gate.per_turn and pos + SLICE < len(data):
                self.backlog = data[pos + SLICE :]
                self.gate.defer()
                return

    def feed_backlog(self) -> None:
        """The turn the backlog waited for (the gate's)."""
        data, self.backlog = self.backlog, b""
        if data and not self.gate.done:
            self.feed(data)

    def received(self, ex: Exchange) -> None:
        """A whole request: queued for its answer, and routed."""
        self.started_ns = 0
        ex.done_ns = self.clock()
        if self.ending and not self.framing:  # draining: serve it (and what came with it)
            self.gate.pause(DRAINING)
        self.queue.append(ex)
        if len(self.queue) >= MAX_PIPELINE:
            self.gate.pause(PIPELINE_FULL)
        try:
            refused = self.state.hosts.refusal(ex.headers) if self.state.hosts else None
            if refused is not None:
                self.respond_error(ex, *refused)
            else:
                self.state.router(self, ex)
        except RequestError as exc:
            self.respond_error(ex, exc.status, exc.message)
        except Exception:  # a handler bug must answer 500, not hang the pipeline behind it
            log.exception("handler failed: %r %r", ex.method, ex.url[:200])
            if ex.response is None:
                self.respond_error(ex, 500, "internal error")

    # -- answers --------------------------------------------------------------------------------
    def respond(
        self,
        ex: Exchange,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        if self.gate.lost:  # closed or closing
            return
        if status == 503 and self.state.stopping:  # the server stops: retry elsewhere
            ex.keep_alive = False
            if not any(name == b"retry-after" for name, _ in extra or ()):
                extra = [*(extra or ()), (b"retry-after", b"1")]
        alive = self.state.alive10 if ex.http10 else self.state.alive
        ex.response = build_response(
            status, body, ex.request_id, content_type, extra, ex.keep_alive, alive
        )
        if ex.method == b"HEAD" and body:  # the head announces the length; no body follows
            ex.response = ex.response[: -len(body)]
        if self.state.access_log is not None:
            self.state.access_log(ex, status)
        ex.status = status
        self.flush()

    def respond_error(
        self,
        ex: Exchange,
        status: int,
        message: str,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.respond(ex, status, shaped_error(ex.url, status, message), extra=extra)

    def flush(self) -> None:
        q = self.queue
        transport = self.transport
        if self.framing:  # Ending.frame_read: what it frames is written once it knows the last
            return
        wrote = False
        while q and q[0].response is not None and transport is not None:
            ex = q.popleft()
            data: bytes = ex.response  # type: ignore[assignment]
            if ex.keep_alive and not q and self.ending and self.end.settled():
                ex.keep_alive, data = False, closing_answer(data)  # the last it owes
            transport.write(data)
            wrote = True
            # Counted once, where written; with the tenant of its key, when it had one.
            self.state.count(protocol_of(ex.url), ex.status, 1, ex.tenant, ex.model)
            if ex.trace is not None:
                ex.trace.written(ex.status, self.clock())
            if not ex.keep_alive:
                self.gate.pause(LOST)
                transport.close()
                q.clear()
                return
        if wrote:
            self.last_active_ns = self.clock()  # idle time counts from the last answer
            if self.ending and self.gate.done and q:  # after an EOF: is the client there?
                check_soon(self.end.check_peer)
        if self.ending and not q and self.end.settled() and transport is not None:
            self.gate.pause(LOST)  # nothing more is owed, nor will be
            transport.close()
            return
        if self.gate.why and len(q) < MAX_PIPELINE:
            self.gate.resume(PIPELINE_FULL)

    def sweep(self, now_ns: int) -> None:
        self.end.sweep(now_ns)


class Ending:
    """How one connection ends: a read timeout (slow head or body), a long idle (counted from
    its last request byte or answer), a peer that leaves its answers unread past the write
    timeout, and a client gone after its EOF (`probe`)."""

    def __init__(self, conn: HttpProtocol) -> None:
        self.conn = conn

    def frame_read(self) -> None:
        """Frame all that was read and waits for a turn, now (the stop, the drain, an EOF);
        the answers it makes are written after, so that the last can say it is the last."""
        conn = self.conn
        conn.framing = True
        try:
            while conn.gate.backlog and not conn.gate.done:
                conn.gate.turn()
        finally:
            conn.framing = False
        conn.flush()

    def settled(self) -> bool:
        """Nothing more will be framed: nothing buffered, and no request partly read (or
        nothing more to be read)."""
        conn = self.conn
        return not conn.backlog and (conn.gate.done or not conn.started_ns)

    def eof(self) -> bool | None:
        """The client shut its sending side. With nothing owed, the connection closes; else
        its answers still go out (a half-close), and it closes after the last of them. A
        client that closed its socket instead is found by `probe` and dropped."""
        conn = self.conn
        conn.ending = True
        self.frame_read()
        conn.gate.pause(EOF)  # a request left partial can never end now
        conn.flush()  # what is answered goes out; with nothing more owed, it closes
        if conn.closing or not conn.queue:
            return None
        if conn.client.texts and conn.state.clients is not None:
            conn.state.clients.behind(conn.client)  # until the probe tells
        self.probe()
        return True

    def drain(self) -> None:
        """The server drains: what was read is framed and served; an idle connection closes
        now; one in the middle of a request reads it to its end; each closes after what it
        owes, its last answer saying `connection: close`."""
        conn = self.conn
        conn.ending = True
        self.frame_read()
        if conn.closing or conn.transport is None:
            return
        if not conn.started_ns:
            conn.gate.pause(DRAINING)  # between requests: read nothing more
        conn.flush()

    def after_owed(self) -> None:
        """Read nothing more (what follows is another protocol); close after the answers owed."""
        conn = self.conn
        conn.ending = True
        conn.gate.pause(DRAINING)
        conn.flush()

    def fail(self, status: int, message: str) -> None:
        """A request that cannot be framed: answer it after those owed, then close."""
        conn = self.conn
        if conn.closing or conn.transport is None:
            return
        ex = conn.reader.current or Exchange()
        if not ex.request_id:
            ex.request_id = conn.state.new_request_id()
        ex.keep_alive = False
        body = shaped_error(ex.url, status, message)  # in the shape of the route's family
        ex.response = build_response(status, body, ex.request_id, keep_alive=False)
        if conn.state.access_log is not None:
            conn.state.access_log(ex, status)
        ex.status = status
        conn.reader.current = None
        conn.gate.pause(DRAINING)
        conn.queue.append(ex)
        conn.flush()  # goes out after the answers still owed, then the connection closes

    def sweep(self, now_ns: int) -> None:
        conn = self.conn
        transport = conn.transport
        if transport is None:
            return
        s = conn.settings
        blocked = WRITE_BLOCKED in conn.gate.why
        if blocked and (now_ns - conn.write_blocked_ns) / 1e9 > s.write_timeout_s:
            conn.gate.pause(LOST)
            transport.abort()  # close() would wait for the peer to read, maybe forever
            return
        if conn.closing:
            return
        if conn.ending and conn.gate.done and conn.queue:
            self.check_peer()
        elif (
            conn.started_ns
            and not conn.gate.paused  # paused by us (answers owed): not the client's delay
            and (now_ns - conn.started_ns) / 1e9 > s.read_timeout_s
        ):
            self.fail(408, "request not received within the read timeout")
        elif (
            not conn.queue
            and not conn.started_ns
            and (now_ns - conn.last_active_ns) / 1e9 > s.keepalive_timeout_s
        ):
            conn.gate.pause(LOST)
            transport.close()

    def probe(self) -> None:
        """After the client's EOF, with answers owed: a shut sending side and a closed socket
        look the same until we write. A `100 Continue` (every HTTP/1.1 client skips an interim
        answer; none goes to an HTTP/1.0 one) makes a closed socket answer with a reset, which
        `check_peer` reads soon after, and at every sweep."""
        conn = self.conn
        if conn.transport is None:
            return
        if not conn.queue[0].http10:
            conn.transport.write(CONTINUE)
        check_soon(self.check_peer)

    def check_peer(self) -> None:
        """The client of a half-closed connection closed its socket: nobody will read what it
        owes, so it is dropped (connection_lost drops its texts still waiting)."""
        conn = self.conn
        if conn.closing or conn.transport is None or not peer_gone(conn.transport):
            return
        conn.gate.pause(LOST)
        conn.transport.abort()
