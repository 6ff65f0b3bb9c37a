"""Hostile clients against a real server: every status code of the contract, broken HTTP,
slow and non-reading clients, the connection cap. After each, other clients are served normally.

One module server with small limits serves every test here; tests leave it as they found it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from devkit.raw import Raw, Resp
from devkit.server import ServerProc, serving, wait_for

MAX_BODY = 65536
READ_TIMEOUT_S = 1.0
KEEPALIVE_S = 2.0
WRITE_TIMEOUT_S = 3.0
MAX_QUEUE = 16
MAX_CONNECTIONS = 8
SERVER_ARGS = [
    "--workers", "1", "--spares", "0",
    "--max-body", str(MAX_BODY),
    "--read-timeout-s", str(READ_TIMEOUT_S),
    "--keepalive-timeout-s", str(KEEPALIVE_S),
    "--write-timeout-s", str(WRITE_TIMEOUT_S),
    "--max-queue", str(MAX_QUEUE),
    "--max-connections", str(MAX_CONNECTIONS),
]  # fmt: skip
SWEEP_SLACK_S = 1.5  # the server checks timeouts every 0.25 s; a busy shared machine adds more
GENERATED_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]+$")


def post(body: bytes, path: str = "/v1/classify", extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def get(path: str, extra: str = "", method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n".encode()


def assert_error(resp: Resp, status: int) -> str:
    assert resp.status == status, (resp.status, resp.body)
    assert resp.headers["content-type"] == "application/json"
    doc = resp.json()
    assert isinstance(doc, dict) and list(doc) == ["error"], doc
    assert isinstance(doc["error"], str) and doc["error"]
    assert resp.headers.get("x-request-id")
    return doc["error"]


def assert_serves(srv: ServerProc) -> None:
    """A normal request on a new connection gets a normal answer."""
    status, headers, body = srv.request("POST", "/v1/classify", {"text": "a warm, funny film"})
    assert status == 200, (status, body)
    doc = json.loads(body)
    assert doc["label"] in ("negative", "positive") and len(doc["scores"]) == 2
    assert headers["x-request-id"] and float(headers["x-latency-ms"]) >= 0


def open_connections(srv: ServerProc) -> int:
    """Client connections the server process holds on its HTTP port (not its listener)."""
    conns = psutil.Process(srv.pid).net_connections("tcp")
    return sum(1 for c in conns if c.laddr and c.laddr.port == srv.port and c.raddr)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    with serving(ServerProc(tmp_path_factory.mktemp("hostile"), SERVER_ARGS), 1) as server:
        pids = server.worker_pids()
        yield server
        pids_after = server.worker_pids()
        restarts = server.status()["restarts_total"]
    assert pids_after == pids, "a worker restarted during the hostile tests"
    assert restarts == 0


@pytest.fixture(scope="module")
def long_text(agnews_texts: list[str]) -> str:
    return " ".join(agnews_texts[:40])[:2500]  # far past 256 tokens: the slowest bucket


# -- 400 ------------------------------------------------------------------------------------------
BAD_BODIES = {
    "truncated JSON": b'{"text": "fine"',
    "empty body": b"",
    "not JSON": b"text=fine",
    "trailing garbage": b'{"text": "fine"} x',
    "huge integer": b'{"text": ' + b"7" * 5000 + b"}",
    "deep nesting": b"[" * 15000,
    "array body": b'["fine"]',
    "string body": b'"fine"',
    "neither key": b'{"txt": "fine"}',
    "both keys": b'{"text": "fine", "texts": ["fine"]}',
    "empty object": b"{}",
    "text number": b'{"text": 5}',
    "text null": b'{"text": null}',
    "text list": b'{"text": ["fine"]}',
    "texts string": b'{"texts": "fine"}',
    "texts numbers": b'{"texts": [1, 2]}',
    "texts with null": b'{"texts": ["fine", null]}',
    "invalid UTF-8": b'{"text": "caf\xe9"}',
    "overlong UTF-8": b'{"text": "\xc0\xaf"}',
    "truncated UTF-8": b'{"text": "\xe2\x82"}',
    "lone high surrogate": b'{"text": "\\ud800"}',
    "lone low surrogate in batch": b'{"texts": ["fine", "\\udfff"]}',
    "empty text": b'{"text": ""}',
    "whitespace text": b'{"text": " \\t\\n\\r "}',
    "unicode whitespace text": b'{"text": "\\u3000\\u2003"}',
    "whitespace in batch": b'{"texts": ["fine", "   "]}',
    "zero texts": b'{"texts": []}',
    "257 texts": json.dumps({"texts": ["fine"] * 257}).encode(),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_bad_body_is_400_and_the_connection_stays_usable(srv: ServerProc, name: str) -> None:
    with Raw(srv.port) as c:
        c.send(post(BAD_BODIES[name]))
        assert_error(c.response(), 400)
        c.send(post(b'{"text": "still here"}'))  # a well-framed 400 keeps the connection
        assert c.response().status == 200
    assert_serves(srv)


def test_batch_over_the_whole_queue_is_refused_whole(srv: ServerProc) -> None:
    status, _, body = srv.request("POST", "/v1/classify", {"texts": [f"ok {i}" for i in range(8)]})
    assert status == 200 and len(json.loads(body)["results"]) == 8
    with Raw(srv.port) as c:  # 256 short texts over a queue of 16: refused whole, not cut
        c.send(post(json.dumps({"texts": ["ok"] * 256}).encode()))
        resp = c.response()
        assert_error(resp, 503)
        assert resp.headers["retry-after"] == "1"


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf", "1e12", ""])
def test_bad_request_timeout_header_is_400(srv: ServerProc, value: str) -> None:
    with Raw(srv.port) as c:
        c.send(post(b'{"text": "fine"}', extra=f"X-Request-Timeout-Ms: {value}\r\n"))
        assert_error(c.response(), 400)


# -- 404, 405 -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "request_bytes",
    [
        get("/nope"),
        get("/v1/classify/extra", method="POST"),
        get("/v1"),
        get("/v1/model/../classify", method="POST"),
        get("/%ff%fe"),
        get("/" + "x" * 2000),
    ],
    ids=["plain", "suffix", "prefix", "dot-dot", "bad-escapes", "long"],
)
def test_unknown_path_is_404(srv: ServerProc, request_bytes: bytes) -> None:
    with Raw(srv.port) as c:
        c.send(request_bytes)
        assert_error(c.response(), 404)
        c.send(get("/v1/model"))
        assert c.response().status == 200
    assert_serves(srv)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/classify", "POST"),
        ("PUT", "/v1/classify", "POST"),
        ("DELETE", "/v1/model", "GET"),
        ("POST", "/v1/model", "GET"),
        ("PATCH", "/v2/health/live", "GET"),
    ],
)
def test_wrong_method_is_405_with_allow(
    srv: ServerProc, method: str, path: str, allow: str
) -> None:
    with Raw(srv.port) as c:
        c.send(post(b"{}", path).replace(b"POST", method.encode(), 1))
        resp = c.response()
        assert_error(resp, 405)
        assert allow in resp.headers["allow"]
    assert_serves(srv)


def test_head_answers_have_no_body(srv: ServerProc) -> None:
    """HEAD gets GET's head, no body: a pipelined request after it stays framed."""
    with Raw(srv.port) as c:
        c.send(get("/v1/model", method="HEAD") + get("/v2/health/live"))
        head = c.response(head_only=True)
        assert head.status == 200 and int(head.headers["content-length"]) > 0
        live = c.response()
        assert live.status == 200 and live.json() == {"live": True}


# -- 413 ------------------------------------------------------------------------------------------
def test_body_over_limit_by_content_length_is_413(srv: ServerProc) -> None:
    with Raw(srv.port) as c:  # the head alone is enough: the body is refused unread
        c.send(b"POST /v1/classify HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        resp = c.response()
        assert_error(resp, 413)
        assert resp.headers["connection"] == "close" and c.closed_by_server()
    with Raw(srv.port) as c:
        c.send(b"POST /v1/classify HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n")
        assert c.response().status in (400, 413)
    assert_serves(srv)


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_body_over_limit_by_chunked_encoding_is_413(srv: ServerProc) -> None:
    head = b"POST /v1/classify HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    ok = json.dumps({"text": "chunked and fine"}).encode()
    with Raw(srv.port) as c:
        c.send(head + chunked(ok, 5))
        assert c.response().status == 200
    big = json.dumps({"text": "x" * MAX_BODY}).encode()
    with Raw(srv.port) as c:
        c.send(head + chunked(big, 1000))
        resp = c.response()
        assert_error(resp, 413)
        assert resp.headers["connection"] == "close" and c.closed_by_server()
    assert_serves(srv)


# -- 431 ------------------------------------------------------------------------------------------
HEADS_TOO_LARGE = {
    "long URL": get("/v1/model?" + "q" * 9000),
    "many headers": get("/v1/model", "".join(f"X-Filler-{i}: {'v' * 20}\r\n" for i in range(400))),
    "one huge header": get("/v1/model", f"X-Huge: {'h' * 9000}\r\n"),
}


@pytest.mark.parametrize("name", list(HEADS_TOO_LARGE))
def test_head_over_8_kib_is_431(srv: ServerProc, name: str) -> None:
    with Raw(srv.port) as c:
        c.send(HEADS_TOO_LARGE[name])
        resp = c.response()
        assert_error(resp, 431)
        assert c.closed_by_server()
    assert_serves(srv)


def test_head_just_under_8_kib_is_served(srv: ServerProc) -> None:
    with Raw(srv.port) as c:
        c.send(get("/v1/model", f"X-Big: {'b' * 7000}\r\n"))
        assert c.response().status == 200


def test_huge_header_dribbled_in_pieces_is_431(srv: ServerProc) -> None:
    with Raw(srv.port) as c:
        c.send(b"GET /v1/model HTTP/1.1\r\nX-Huge: ")
        for _ in range(10):
            c.send(b"h" * 1000)
        c.send(b"\r\n\r\n")
        assert_error(c.response(), 431)
    assert_serves(srv)


# -- 503, 504 -------------------------------------------------------------------------------------
@contextmanager
def worker_held(srv: ServerProc) -> Iterator[None]:
    """Hold the only worker still (SIGSTOP), so that nothing is answered meanwhile however fast
    the model is; callers keep it well under the 5 s heartbeat timeout, so it is not replaced."""
    (pid,) = srv.worker_pids().values()
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def occupy(srv: ServerProc, long_text: str, n: int) -> Raw:
    """Admit n slow texts (one request) and wait until the server counts them as queued."""
    c = Raw(srv.port, timeout=120)
    try:
        c.send(post(json.dumps({"texts": [f"{long_text} {i}" for i in range(n)]}).encode()))
        wait_for(lambda: srv.status()["queue_depth"] >= n, 20, f"{n} requests queued")
    except BaseException:
        c.close()
        raise
    return c


def test_full_queue_is_503_with_retry_after(srv: ServerProc, long_text: str) -> None:
    busy = None
    try:
        with worker_held(srv):  # the queue stays full however fast the model is
            busy = occupy(srv, long_text, MAX_QUEUE)
            with Raw(srv.port) as c:
                c.send(post(b'{"text": "no room"}'))
                resp = c.response()
                assert_error(resp, 503)
                assert resp.headers["retry-after"] == "1"
                assert float(resp.headers["x-latency-ms"]) < 1000  # refused at once, not queued
        assert busy.response().status == 200  # the admitted ones are answered in full
    finally:
        if busy is not None:
            busy.close()
    assert_serves(srv)


def test_tiny_deadline_is_504(srv: ServerProc, long_text: str) -> None:
    with Raw(srv.port) as c:
        c.send(post(json.dumps({"text": long_text}).encode(), extra="X-Request-Timeout-Ms: 1\r\n"))
        assert_error(c.response(), 504)
    assert_serves(srv)


def test_deadline_passing_while_queued_is_504(srv: ServerProc, long_text: str) -> None:
    n = MAX_QUEUE // 2
    busy = None
    try:
        # Held still, the worker can serve neither the texts ahead nor the hurried one, however
        # fast the model is: only the deadline can answer it.
        with worker_held(srv):
            busy = occupy(srv, long_text, n)
            with Raw(srv.port) as c:
                t0 = time.monotonic()
                c.send(post(b'{"text": "in a hurry"}', extra="X-Request-Timeout-Ms: 300\r\n"))
                resp = c.response()
                waited = time.monotonic() - t0
            assert_error(resp, 504)
            assert 0.25 < waited < 0.3 + SWEEP_SLACK_S, waited  # at its deadline, not later
            assert srv.status()["queue_depth"] == n  # it left the queue; the ones ahead did not
        assert busy.response().status == 200
    finally:
        if busy is not None:
            busy.close()
    assert_serves(srv)


# -- broken HTTP ----------------------------------------------------------------------------------
CL_BODY = b'{"text": "fine"}'
CHUNKED = b"POST /v1/classify HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
BROKEN = {
    "garbage bytes": b"\x00\x01\x02\xff\xfe garbage\r\n\r\n",
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "obsolete line folding": b"GET /v1/model HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n",
    "bare CR": b"GET /v1/model HTTP/1.1\rX-A: b\r\n\r\n",
    "bad version": b"GET /v1/model HTTP/x.y\r\n\r\n",
    "space in header name": b"GET /v1/model HTTP/1.1\r\nBad Header: x\r\n\r\n",
    "NUL in header value": b"GET /v1/model HTTP/1.1\r\nX-A: a\x00b\r\n\r\n",
    "header without colon": b"GET /v1/model HTTP/1.1\r\nnocolon\r\n\r\n",
    "bad chunk size": CHUNKED + b"zz\r\nab\r\n",
    "chunk size overflow": (
        b"POST /v1/classify HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"fffffffffffffffffffff\r\nab\r\n"
    ),
    "chunk data too long": (
        b"POST /v1/classify HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n0\r\n\r\n"
    ),
    "unknown transfer coding": (
        b"POST /v1/classify HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n" + CL_BODY
    ),
    "duplicate Content-Length": (
        b"POST /v1/classify HTTP/1.1\r\nContent-Length: 16\r\nContent-Length: 16\r\n\r\n" + CL_BODY
    ),
    "conflicting Content-Length": (
        b"POST /v1/classify HTTP/1.1\r\nContent-Length: 16\r\nContent-Length: 4\r\n\r\n" + CL_BODY
    ),
    "Content-Length list": b"POST /v1/classify HTTP/1.1\r\nContent-Length: 16, 16\r\n\r\n"
    + CL_BODY,
    "negative Content-Length": b"POST /v1/classify HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    "Content-Length with Transfer-Encoding": (
        b"POST /v1/classify HTTP/1.1\r\nContent-Length: 16\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"10\r\n" + CL_BODY + b"\r\n0\r\n\r\n"
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_http_is_400_then_closed(srv: ServerProc, name: str) -> None:
    with Raw(srv.port) as c:
        c.send(BROKEN[name])
        resp = c.response()
        assert_error(resp, 400)
        assert resp.headers["connection"] == "close"
        assert c.closed_by_server()
    assert_serves(srv)


def test_broken_request_after_good_ones_answers_them_first(srv: ServerProc) -> None:
    with Raw(srv.port) as c:
        c.send(post(b'{"text": "first"}') + get("/v1/model") + b"\x00garbage\r\n\r\n")
        assert c.response().status == 200
        assert c.response().status == 200
        assert_error(c.response(), 400)
        assert c.closed_by_server()


@pytest.mark.parametrize(
    "request_bytes",
    [
        get("/v1/model", "Connection: Upgrade\r\nUpgrade: websocket\r\n") + b"\x81\x05hello",
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n\x16\x03\x01",
    ],
    ids=["upgrade", "connect"],
)
def test_upgrade_and_connect_get_one_answer_then_close(
    srv: ServerProc, request_bytes: bytes
) -> None:
    """What follows an upgrade is another protocol: answer the request once, then close."""
    with Raw(srv.port) as c:
        c.send(request_bytes)
        resp = c.response()
        assert resp.status in (200, 400, 404), resp  # CONNECT's Host (example.com): 400 here
        assert c.closed_by_server() and c.buf == b"", c.buf[:200]
    assert_serves(srv)


# -- X-Request-Id ---------------------------------------------------------------------------------
def test_valid_request_id_is_echoed_on_answers_and_errors(srv: ServerProc) -> None:
    with Raw(srv.port) as c:
        c.send(post(b'{"text": "fine"}', extra="X-Request-Id: job-7.a:b_c\r\n"))
        assert c.response().headers["x-request-id"] == "job-7.a:b_c"
        c.send(get("/nope", "X-Request-Id: req-404\r\n"))
        assert c.response().headers["x-request-id"] == "req-404"


@pytest.mark.parametrize(
    "bad_id",
    [b"has space", b"x" * 129, b"semi;colon", b"<script>", b"caf\xc3\xa9", b'quote"d', b"a\tb"],
)
def test_invalid_request_id_is_not_echoed(srv: ServerProc, bad_id: bytes) -> None:
    for request in (post(b'{"text": "fine"}'), get("/nope")):
        head, rest = request.split(b"\r\n", 1)
        with Raw(srv.port) as c:
            c.send(head + b"\r\nX-Request-Id: " + bad_id + b"\r\n" + rest)
            rid = c.response().headers["x-request-id"]
            assert rid.encode() != bad_id.strip() and GENERATED_ID.match(rid), rid


# -- slow clients ---------------------------------------------------------------------------------
def dribble(port: int, data: bytes, start: int, result: dict[str, object]) -> None:
    """Send data[:start] at once, then the rest 4 bytes each 0.1 s: far slower than allowed."""
    t0 = time.monotonic()
    with Raw(port) as c:
        c.send(data[:start])
        for i in range(start, len(data), 4):
            if not c.send(data[i : i + 4]):
                break
            time.sleep(0.1)  # the slowness under test: 40 bytes/s
        result["answer"] = c.response()
        result["closed_after"] = time.monotonic() - t0
        result["closed"] = c.closed_by_server()


@pytest.mark.parametrize("part", ["head", "body"])
def test_slow_client_is_closed_after_the_read_timeout(srv: ServerProc, part: str) -> None:
    data = post(json.dumps({"text": "slow " * 30}).encode())  # 60 bytes of head, 170 of body
    start = 0 if part == "head" else data.index(b"\r\n\r\n") + 4
    result: dict[str, object] = {}
    t = threading.Thread(target=dribble, args=(srv.port, data, start, result))
    t.start()
    served = 0
    deadline = time.monotonic() + READ_TIMEOUT_S + SWEEP_SLACK_S
    # Other clients are served normally meanwhile: at least 3, and until the slow one is closed.
    while time.monotonic() < deadline and (t.is_alive() or served < 3):
        assert_serves(srv)
        served += 1
    t.join(30)
    assert not t.is_alive()
    assert served >= 3
    answer = result["answer"]
    assert isinstance(answer, Resp)
    assert_error(answer, 408)
    assert result["closed"] is True
    elapsed = result["closed_after"]
    assert isinstance(elapsed, float)
    assert READ_TIMEOUT_S * 0.9 <= elapsed <= READ_TIMEOUT_S + SWEEP_SLACK_S, elapsed


def test_idle_keepalive_connections_are_closed(srv: ServerProc) -> None:
    with Raw(srv.port) as used, Raw(srv.port) as silent:
        used.send(get("/v1/model"))
        assert used.response().status == 200
        t0 = time.monotonic()
        assert used.closed_by_server()  # within the socket timeout (20 s)
        assert silent.closed_by_server()  # connected, never sent a byte
        elapsed = time.monotonic() - t0
        assert KEEPALIVE_S * 0.8 <= elapsed <= KEEPALIVE_S + SWEEP_SLACK_S, elapsed


# -- the connection cap ---------------------------------------------------------------------------
def test_connections_over_the_cap_are_refused_then_served_again(srv: ServerProc) -> None:
    wait_for(lambda: open_connections(srv) == 0, 10, "no client connections")
    held = [Raw(srv.port) for _ in range(MAX_CONNECTIONS)]
    try:
        for c in held:  # all eight are served
            c.send(get("/v2/health/live"))
            assert c.response().status == 200
        with Raw(srv.port) as extra:
            resp = extra.response()  # refused before it sent anything
            assert_error(resp, 503)
            assert resp.headers["retry-after"] == "1" and resp.headers["connection"] == "close"
            assert extra.closed_by_server()
        for c in held[:2]:
            c.close()
        wait_for(lambda: open_connections(srv) <= MAX_CONNECTIONS - 2, 10, "two closed")
        with Raw(srv.port) as again:
            again.send(get("/v2/health/live"))
            assert again.response().status == 200
        for c in held[2:]:  # the ones held all along still work
            c.send(get("/v2/health/live"))
            assert c.response().status == 200
    finally:
        for c in held:
            c.close()
    wait_for(lambda: open_connections(srv) == 0, 10, "no client connections")
    assert_serves(srv)


# -- a client that never reads its answers --------------------------------------------------------
def test_client_that_never_reads_cannot_grow_the_server(srv: ServerProc) -> None:
    """Reading pauses while answers cannot be written: the client's sends stall, the server's
    memory stays flat, others are served, and the write timeout finally drops the client."""
    front = psutil.Process(srv.pid)
    rss_before = front.memory_info().rss
    # answered at once, so only the unread answers (not the workers) can stop the reading
    offered = (get("/v1/model") + get("/nope")) * 400_000  # about 30 MB
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # set before connecting: the kernel
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)  # cannot soak up what goes unread
    c.connect(("127.0.0.1", srv.port))
    c.setblocking(False)
    sent = 0
    last_progress = time.monotonic()
    try:
        while sent < len(offered) and time.monotonic() - last_progress < 1.0:
            try:
                sent += c.send(offered[sent : sent + 262144])
                last_progress = time.monotonic()
            except BlockingIOError:
                time.sleep(0.01)  # poll the stalled socket
            except (ConnectionResetError, BrokenPipeError):
                break
        assert sent < len(offered) / 4, f"the server kept reading: {sent} of {len(offered)}"
        # served beside it (its own last requests may hold the small queue for a moment)
        wait_for(lambda: srv.request("POST", "/v1/classify", {"text": "ok"})[0] == 200, 10, "200")
        growth = front.memory_info().rss - rss_before
        assert growth < 64 * 2**20, f"front-end grew by {growth / 2**20:.0f} MiB"
        # the write timeout drops the non-reading client although it still holds its end
        wait_for(lambda: open_connections(srv) == 0, WRITE_TIMEOUT_S + 5, "non-reader dropped")
    finally:
        c.close()
    assert_serves(srv)


def unread_by_server(server_port: int, client_port: int) -> int:
    """Bytes the kernel holds for the server on this connection that it has not read yet."""
    local, remote = f"0100007F:{server_port:04X}", f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            return int(fields[4].split(":")[1], 16)
    raise AssertionError("connection not found in /proc/net/tcp")


def test_pipelined_client_is_not_timed_out_while_the_server_is_busy(
    srv: ServerProc, long_text: str
) -> None:
    """Reading pauses at 64 answers owed; the time a request then waits is not its delay."""
    slow = post(json.dumps({"texts": [f"{long_text} {i}" for i in range(MAX_QUEUE)]}).encode())
    quick = post(b'{"text": "quick"}')
    batch = slow + quick * 63  # the first fills the queue for seconds; 63 refused behind it
    assert len(batch) < 60000  # one segment: the 65th request's start is read with the 64th
    with Raw(srv.port, timeout=120) as c:
        client_port = c.sock.getsockname()[1]
        c.send(batch + quick[:20])  # the 65th request stops mid-head, then reading pauses
        wait_for(lambda: unread_by_server(srv.port, client_port) == 0, 10, "server read all")
        c.send(quick[20:])  # waits in the kernel while the server is busy far past 1 s
        codes = [c.response().status for _ in range(65)]
        assert codes[0] == 200 and set(codes[1:64]) <= {200, 503}, codes
        assert codes[64] == 200  # not 408: the read clock runs only while the server reads


# -- the control socket ---------------------------------------------------------------------------
class Ctl:
    """A line-at-a-time client of the control socket."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(20)
        self.sock.connect(path)
        self.buf = b""

    def __enter__(self) -> Ctl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def ask(self, line: bytes) -> dict:
        self.sock.sendall(line + b"\n")
        return self.reply()

    def reply(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "control socket closed"
            self.buf += chunk
        reply, self.buf = self.buf.split(b"\n", 1)
        doc = json.loads(reply)
        assert isinstance(doc, dict) and isinstance(doc.get("ok"), bool), doc
        return doc


CONTROL_JUNK = [
    b"",
    b"   ",
    b"hello",
    b"\xff\xfe\x00",
    b"[1, 2]",
    b'"status"',
    b"{",
    b"{}",
    b'{"cmd": null}',
    b'{"cmd": 5}',
    b'{"cmd": ["status"]}',
    b'{"cmd": "STATUS"}',
    b'{"cmd": "shutdown"}',
    b'{"cmd": "restart"}',
    b'{"cmd": "restart", "worker": "0"}',
    b'{"cmd": "restart", "worker": 1.5}',
    b'{"cmd": "restart", "worker": true}',
    b'{"cmd": "restart", "worker": 999}',
    b'{"cmd": "restart", "worker": -1}',
    b'{"cmd": "restart", "worker": ' + b"9" * 5000 + b"}",
    b'{"cmd": "scale", "workers": 0}',
    b'{"cmd": "scale", "workers": 100000}',
    b'{"cmd": "scale", "workers": "2"}',
    b'{"cmd": "scale"}',
    b"[" * 10000,
]


def test_control_socket_answers_junk_with_ok_false_and_stays_usable(srv: ServerProc) -> None:
    with Ctl(srv.control) as ctl:
        for line in CONTROL_JUNK:
            reply = ctl.ask(line)
            assert reply["ok"] is False and isinstance(reply["error"], str), (line[:40], reply)
        assert ctl.ask(b'{"cmd": "status"}')["ok"] is True  # the same connection still works
        assert ctl.ask(b'nonsense\n{"cmd": "status"}')["ok"] is False  # two lines, one write
        assert ctl.reply()["ok"] is True
    assert srv.ready_workers() == 1


def test_control_line_over_the_limit_is_refused_and_closed(srv: ServerProc) -> None:
    with Ctl(srv.control) as ctl:
        ctl.sock.sendall(b"x" * (65536 + 4096))
        reply = b""
        while chunk := ctl.sock.recv(65536):
            reply += chunk
        doc = json.loads(reply)
        assert doc["ok"] is False and "longer" in doc["error"]
    assert srv.status()["ok"] is True
