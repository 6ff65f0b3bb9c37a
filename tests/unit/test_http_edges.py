"""HTTP/1.1's edges, byte for byte, in process (issue 56, item 7): trailers never become
headers, a chunked body counts as sent toward --max-body, a half-closed client still gets its
answers while one that closed its socket is dropped, idle time counts from the last answer
with `keep-alive: timeout=N` said (and HTTP/1.0's keep-alive echoed), the Host and Origin
checks (--allowed-hosts), failed keys throttled by client address, and the connection cap
shared out by address. The production HttpProtocol on a fake transport and a fake clock; no
process, no socket."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from ringserve.service.config.settings import Config
from ringserve.service.engine.tenants import KeyRing
from ringserve.service.protocols.auth import guard_http
from ringserve.service.protocols.hosts import HostCheck, split_authority
from ringserve.service.protocols.http import CONTINUE, Exchange, HttpProtocol, HttpServerState
from ringserve.service.protocols.peers import TCP_CLOSE, KeyFailures, Seats, peer_of

from devkit.fakes import Clock, S, Transport

SETTINGS = Config(max_body=1024, keepalive_timeout_s=100.0, read_timeout_s=10.0)


class Sock:
    """What getsockopt(TCP_INFO) says of the connection: its state byte first."""

    def __init__(self, state: int = 8) -> None:  # 8: CLOSE_WAIT (the peer sent its FIN)
        self.state = state

    def getsockopt(self, level: int, name: int, size: int) -> bytes:
        return bytes([self.state]) + bytes(size - 1)


class PeerTransport(Transport):
    """A fake transport with a peer address and a socket whose TCP state a test sets."""

    def __init__(self, peer: str = "192.0.2.7") -> None:
        super().__init__()
        self.sock = Sock()
        self.peer = peer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": (self.peer, 40000), "socket": self.sock}.get(name, default)


def seen_router(seen: list[Exchange], answer: bool = True) -> Any:
    def route(conn: HttpProtocol, ex: Exchange) -> None:
        seen.append(ex)
        if answer:
            conn.respond(ex, 200, b"{}")

    return route


def connection(
    route: Any, settings: Config = SETTINGS, transport: Transport | None = None
) -> tuple[HttpProtocol, Transport, Clock]:
    clock = Clock()
    state = HttpServerState(settings, route, lambda *_: None, clock)
    conn, transport = HttpProtocol(state), transport or PeerTransport()
    conn.connection_made(transport)
    return conn, transport, clock


def heads(written: bytes) -> list[bytes]:
    """The head of every answer written (bodies are `{}` or an error, never CRLF CRLF)."""
    return [part.split(b"\r\n\r\n")[0] for part in written.split(b"HTTP/1.1 ")[1:]]


# -- trailers and chunk extensions ----------------------------------------------------------------
def test_a_trailer_never_becomes_a_header() -> None:
    seen: list[Exchange] = []
    conn, transport, _ = connection(seen_router(seen))
    conn.data_received(
        b"POST /v1/classify HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
        b"Trailer: Authorization\r\n\r\n"
        b"2\r\n{}\r\n0\r\nAuthorization: Bearer sesame\r\nX-Priority: bulk\r\n\r\n"
    )
    (ex,) = seen
    assert b"authorization" not in ex.headers and b"x-priority" not in ex.headers
    assert b"".join(ex.body) == b"{}" and transport.written.startswith(b"HTTP/1.1 200 ")


def test_a_trailer_key_does_not_authenticate() -> None:
    keys = KeyRing("sesame")
    seen: list[Exchange] = []
    conn, transport, _ = connection(guard_http(keys, seen_router(seen)))
    conn.data_received(
        b"POST /v1/classify HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\nAuthorization: Bearer sesame\r\n\r\n"
    )
    assert seen == [] and transport.written.startswith(b"HTTP/1.1 401 ")
    conn.data_received(  # the same key in the head does
        b"POST /v1/classify HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer sesame\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    assert len(seen) == 1 and transport.written.count(b"HTTP/1.1 200 ") == 1


def test_chunk_extensions_count_toward_the_body_limit() -> None:
    """One byte of data behind 4 KiB of chunk extensions (max_body 1024): the parser reads
    past the extension without a callback; measured as sent, the body is over the limit."""
    seen: list[Exchange] = []
    conn, transport, _ = connection(seen_router(seen))
    head = b"POST /v1/classify HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    ext = b";x=" + b"a" * 4096
    conn.data_received(head)
    for k in range(4):  # the extension alone, in the pieces a socket might give
        conn.data_received((b"1" + ext)[k * 1100 : (k + 1) * 1100])
    conn.data_received((b"1" + ext)[4400:] + b"\r\nx\r\n0\r\n\r\n")
    assert seen == []
    assert transport.written.startswith(b"HTTP/1.1 413 ") and b"as sent" in transport.written
    assert transport.closed


def test_a_chunked_body_within_the_limit_as_sent_is_served() -> None:
    seen: list[Exchange] = []
    conn, transport, _ = connection(seen_router(seen))
    body = b'{"text": "' + b"x" * 700 + b'"}'
    chunks = b"".join(b"%x;n=1\r\n%s\r\n" % (len(body[i : i + 100]), body[i : i + 100])
                      for i in range(0, len(body), 100))  # fmt: skip
    conn.data_received(
        b"POST /v1/classify HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks + b"0\r\n\r\n"
    )  # fmt: skip
    assert len(seen) == 1 and b"".join(seen[0].body) == body
    assert transport.written.startswith(b"HTTP/1.1 200 ")


# -- half-close -----------------------------------------------------------------------------------
def test_a_half_closed_client_gets_its_answers_then_the_connection_closes() -> None:
    seen: list[Exchange] = []
    conn, transport, _ = connection(seen_router(seen, answer=False))
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n")
    assert conn.eof_received() is True  # keep the sending side open: two answers owed
    assert transport.written == CONTINUE  # the probe: a closed socket answers it with a reset
    conn.end.check_peer()  # CLOSE_WAIT: the client reads on
    assert not transport.closed
    conn.respond(seen[0], 200, b"{}")
    assert not transport.closed  # one still owed
    conn.respond(seen[1], 200, b"{}")
    first, last = heads(transport.written[len(CONTINUE) :])
    assert b"keep-alive: timeout=100" in first.lower()
    assert b"connection: close" in last.lower() and b"keep-alive:" not in last.lower()
    assert transport.closed


def test_an_eof_with_nothing_owed_closes() -> None:
    conn, transport, _ = connection(seen_router([]))
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")  # answered at once
    assert conn.eof_received() is None  # the transport closes itself
    assert transport.written.count(b"HTTP/1.1 ") == 1


def test_a_client_that_closed_its_socket_is_dropped_with_its_waiting_texts() -> None:
    seen: list[Exchange] = []
    conn, transport, _ = connection(seen_router(seen, answer=False))
    left: list[Any] = []
    conn.state.clients = SimpleNamespace(leave=left.append, behind=left.append)
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
    conn.client.texts = 256  # what its request was admitted with
    conn.eof_received()
    transport.sock.state = TCP_CLOSE  # the probe was answered with a reset
    conn.end.check_peer()
    assert transport.aborted
    conn.connection_lost(None)  # the loop's call, once aborted
    assert left == [conn.client, conn.client]  # behind the others at its EOF, then gone


def test_an_http10_client_gets_no_interim_answer() -> None:
    conn, transport, _ = connection(seen_router([], answer=False))
    conn.data_received(b"GET /a HTTP/1.0\r\nHost: h\r\n\r\n")
    assert conn.eof_received() is True and transport.written == b""


# -- keep-alive -----------------------------------------------------------------------------------
def test_idle_time_counts_from_the_last_answer() -> None:
    seen: list[Exchange] = []
    conn, transport, clock = connection(seen_router(seen, answer=False))
    conn.data_received(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
    clock.now += 90 * S  # a long answer
    conn.respond(seen[0], 200, b"{}")
    clock.now += 60 * S  # 150 s after the request, 60 s after the answer: still alive
    conn.sweep(clock.now)
    assert not transport.closed
    clock.now += 41 * S
    conn.sweep(clock.now)
    assert transport.closed


@pytest.mark.parametrize(
    ("request_line", "connection_header", "want"),
    [
        (b"GET / HTTP/1.1", b"", [b"keep-alive: timeout=100"]),
        (b"GET / HTTP/1.0", b"Connection: keep-alive\r\n",
         [b"connection: keep-alive", b"keep-alive: timeout=100"]),
        (b"GET / HTTP/1.0", b"", [b"connection: close"]),
        (b"GET / HTTP/1.1", b"Connection: close\r\n", [b"connection: close"]),
    ],
    ids=["1.1", "1.0-keep-alive", "1.0", "1.1-close"],
)  # fmt: skip
def test_keep_alive_is_said_and_echoed(
    request_line: bytes, connection_header: bytes, want: list[bytes]
) -> None:
    conn, transport, _ = connection(seen_router([]))
    conn.data_received(request_line + b"\r\nHost: h\r\n" + connection_header + b"\r\n")
    (head,) = heads(transport.written)
    lines = head.lower().split(b"\r\n")
    assert [ln for ln in lines if ln.startswith((b"connection:", b"keep-alive:"))] == want


# -- Host and Origin ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "want"),
    [(b"localhost:8000", ("localhost", 8000)), (b"[::1]:80", ("::1", 80)), (b"::1", ("::1", None)),
     (b"Example.COM.", ("example.com", None)), (b"127.0.0.1", ("127.0.0.1", None))],
)  # fmt: skip
def test_authorities_split(value: bytes, want: tuple[str, int | None]) -> None:
    assert split_authority(value) == want


LOOPBACK = HostCheck.for_listener(None, "127.0.0.1")
ANY = HostCheck.for_listener(None, "0.0.0.0")
LISTED = HostCheck.for_listener("api.example.com, *.corp.example", "0.0.0.0")


@pytest.mark.parametrize(
    ("check", "headers", "code"),
    [
        (LOOPBACK, {b"host": b"localhost:8000"}, None),
        (LOOPBACK, {b"host": b"127.0.0.1:8000"}, None),
        (LOOPBACK, {b"host": b"127.0.0.2"}, None),
        (LOOPBACK, {b"host": b"[::1]:8000"}, None),
        (LOOPBACK, {b"host": b"app.localhost:8000"}, None),
        (LOOPBACK, {}, None),  # HTTP/1.0 without a Host: no name to rebind
        (LOOPBACK, {b"host": b"evil.example:8000"}, 400),  # DNS rebinding
        (LOOPBACK, {b"host": b"localhost.evil.example"}, 400),
        (ANY, {b"host": b"10.1.2.3:8000"}, None),
        (LISTED, {b"host": b"api.example.com"}, None),
        (LISTED, {b"host": b"a.corp.example:8000"}, None),
        (LISTED, {b"host": b"corp.example"}, 400),
        # Origin: a page on another site, without a key
        (LOOPBACK, {b"host": b"localhost:8000", b"origin": b"https://evil.example"}, 403),
        (LOOPBACK, {b"host": b"localhost:8000", b"origin": b"null"}, 403),
        (ANY, {b"host": b"10.1.2.3:8000", b"origin": b"http://evil.example"}, 403),
        (ANY, {b"host": b"10.1.2.3:8000", b"origin": b"http://10.1.2.3:8001"}, 403),
        # ... with a key, the same origin, or a listed name: answered
        (LOOPBACK, {b"host": b"localhost:8000", b"origin": b"https://evil.example",
                    b"authorization": b"Bearer k"}, None),
        (LOOPBACK, {b"host": b"localhost:8000", b"origin": b"http://localhost:8000"}, None),
        (LOOPBACK, {b"host": b"localhost:8000", b"origin": b"http://localhost:3000"}, None),
        (ANY, {b"host": b"10.1.2.3:8000", b"origin": b"http://10.1.2.3:8000"}, None),
        (ANY, {b"host": b"10.1.2.3", b"origin": b"http://10.1.2.3"}, None),
        (LISTED, {b"host": b"api.example.com", b"origin": b"https://a.corp.example"}, None),
    ],
)  # fmt: skip
def test_host_and_origin(check: HostCheck, headers: dict[bytes, bytes], code: int | None) -> None:
    refused = check.refusal(headers)
    assert (refused[0] if refused else None) == code, refused


def test_a_refused_host_is_answered_before_any_route() -> None:
    seen: list[Exchange] = []
    conn, transport, _ = connection(seen_router(seen))
    conn.state.hosts = LOOPBACK
    conn.data_received(
        b"POST /v1/classify HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 2\r\n\r\n{}"
    )
    conn.data_received(
        b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}"
    )
    conn.data_received(
        b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert [h.split(b" ")[0] for h in heads(transport.written)] == [b"400", b"403", b"200"]
    assert len(seen) == 1 and not transport.closed  # refusals keep the connection


# -- failed keys ----------------------------------------------------------------------------------
def test_failed_keys_are_throttled_by_address() -> None:
    clock = Clock()
    failures = KeyFailures(3, 30.0, lambda: clock.now / S)  # 3 at once, then one each 10 s
    seen: list[Exchange] = []
    state = HttpServerState(SETTINGS, guard_http(KeyRing("sesame"), seen_router(seen), failures),
                            lambda *_: None, clock)  # fmt: skip

    def ask(key: bytes, peer: str = "192.0.2.7") -> bytes:
        conn, transport = HttpProtocol(state), PeerTransport(peer)
        conn.connection_made(transport)
        conn.data_received(
            b"GET /v1/model HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer %s\r\n\r\n" % key
        )
        return heads(transport.written)[0]

    assert [ask(b"guess%d" % i).split(b" ")[0] for i in range(3)] == [b"401"] * 3
    throttled = ask(b"sesame")  # past them: refused unchecked, even the right key
    assert throttled.startswith(b"429") and b"retry-after: 10" in throttled.lower()
    assert ask(b"sesame", peer="198.51.100.1").startswith(b"200")  # another address
    clock.now += 10 * S  # one attempt refilled
    assert ask(b"sesame").startswith(b"200")
    assert ask(b"guess").startswith(b"401") and ask(b"guess").startswith(b"429")
    assert failures.throttled == 2 and len(seen) == 2


def test_ipv6_clients_are_counted_by_their_64() -> None:
    one, two = PeerTransport("2001:db8:1:2::10"), PeerTransport("2001:db8:1:2:ffff::1")
    assert peer_of(one) == peer_of(two) == "2001:db8:1:2::/64"
    assert peer_of(PeerTransport("::ffff:192.0.2.1")) == "192.0.2.1"
    assert peer_of(Transport()) == ""


# -- the connection cap ---------------------------------------------------------------------------
def test_at_the_cap_a_client_with_fewer_connections_takes_an_idle_one_of_the_busiest() -> None:
    clock = Clock()
    state = HttpServerState(Config(max_connections=3), seen_router([]), lambda *_: None, clock)

    def open_from(peer: str) -> tuple[HttpProtocol, PeerTransport]:
        conn, transport = HttpProtocol(state), PeerTransport(peer)
        conn.connection_made(transport)
        clock.now += S
        return conn, transport

    hog = [open_from("192.0.2.66") for _ in range(3)]  # the cap, one address, all idle
    hog[1][0].data_received(b"GET /a HTTP/1.1\r\nHost: h\r\n")  # one is busy (mid-request)
    mine, mine_t = open_from("198.51.100.1")
    assert not mine_t.closed and mine in state.connections
    assert [t.closed for _, t in hog] == [True, False, False]  # the longest idle gave way
    _, third_t = open_from("198.51.100.1")  # 2 + 1 against the hog's 2: no share to take
    assert third_t.closed and third_t.written.startswith(b"HTTP/1.1 503 ")
    assert state.seats.count == 3 and state.seats.evicted == 1


def test_seats_refuse_when_the_busiest_has_nothing_idle() -> None:
    class Busy:
        def __init__(self, peer: str) -> None:
            self.peer = peer

        def idle_since(self) -> float | None:
            return None

        def evict(self) -> None:
            raise AssertionError("a busy connection is never evicted")

    seats = Seats(2)
    assert seats.take(Busy("a")) and seats.take(Busy("a"))
    assert not seats.take(Busy("b"))


def test_failed_keys_remember_a_bounded_number_of_addresses() -> None:
    clock = Clock()
    failures = KeyFailures(2, 60.0, lambda: clock.now / S)
    for k in range(5000):  # one failure each from 5,000 addresses
        failures.failed(f"10.0.{k // 256}.{k % 256}")
    assert len(failures.buckets) <= 4096
    failures.failed("192.0.2.1")
    failures.failed("192.0.2.1")  # the newest are kept: this one is throttled
    assert failures.wait_s("192.0.2.1") == 30


# -- the stop and the drain -----------------------------------------------------------------------
def test_after_the_stop_a_503_says_retry_after_and_closes() -> None:
    def busy(conn: HttpProtocol, ex: Exchange) -> None:
        conn.respond_error(ex, 503, "overloaded")

    conn, transport, _ = connection(busy)
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
    assert b"connection: close" not in transport.written and not transport.closed
    conn.state.stopping = True  # Ports.stopping, at the signal
    conn.data_received(b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n")
    last = heads(transport.written)[-1].lower()
    assert b"retry-after: 1" in last and b"connection: close" in last and transport.closed


def test_the_drain_answers_every_pipelined_request_already_read() -> None:
    """200 pipelined requests in one read: those of its first slice are framed in its turn, the
    rest wait for the next; the drain begins before it. All 200 are answered, the last with
    `connection: close`."""

    async def run() -> tuple[bytes, bool]:
        conn, transport, _ = connection(seen_router([]))
        conn.data_received(b"GET /a HTTP/1.1\r\n\r\n" * 200)
        assert conn.backlog and transport.written.count(b"HTTP/1.1 200 ") < 200
        conn.state.begin_drain()
        return transport.written, transport.closed

    written, closed = asyncio.run(run())
    answers = heads(written)
    assert len(answers) == 200 and closed
    assert all(b"keep-alive: timeout=100" in h.lower() for h in answers[:-1])
    assert b"connection: close" in answers[-1].lower()
