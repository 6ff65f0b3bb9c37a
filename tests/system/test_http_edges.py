"""HTTP/1.1's edges against a real server, byte for byte over raw sockets (issue 56, item 7):
a trailer's key does not authenticate, chunk extensions count toward --max-body, a half-closed
client gets its answers, idle time counts from the last answer and says `keep-alive: timeout`,
HTTP/1.0's keep-alive is echoed, the Host and Origin checks, and failed keys throttled by
client address (HTTP and binary). While each attack runs, a normal client is served."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator

import pytest
from ringserve.wire.frames import AUTH_PREFIX, encode_frame, parse_answers

from devkit.raw import Raw
from devkit.server import ServerProc, serving

KEY = "edge-key-5b1c"
MAX_BODY = 65536
KEEPALIVE_S = 2.0
FAILURES, WINDOW_S = 5, 10.0  # one attempt each 2 s once spent


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    args = ["--workers", "1", "--spares", "0", "--max-body", str(MAX_BODY),
            "--keepalive-timeout-s", str(KEEPALIVE_S), "--heartbeat-timeout-s", "60",
            "--auth-failures", str(FAILURES), "--auth-window-s", str(WINDOW_S)]  # fmt: skip
    srv = ServerProc(tmp_path_factory.mktemp("edges"), args, env={"RINGSERVE_API_KEY": KEY})
    with serving(srv):
        yield srv


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path_factory.mktemp("keyless"), ["--workers", "1", "--spares", "0"])
    with serving(srv):
        yield srv


def post(body: bytes, extra: str = "", host: str = "localhost") -> bytes:
    head = f"POST /v1/classify HTTP/1.1\r\nHost: {host}\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


TEXT = b'{"text": "a warm and funny film"}'
AUTH = f"Authorization: Bearer {KEY}\r\n"


def served(srv: ServerProc, key: bool = True) -> None:
    """A normal client is answered as usual."""
    headers = {"Authorization": f"Bearer {KEY}"} if key else {}
    status, _, body = srv.request("POST", "/v1/classify", {"text": "fine"}, headers=headers)
    assert status == 200, body


def test_a_trailers_key_does_not_authenticate(keyed: ServerProc) -> None:
    with Raw(keyed.port, source="127.0.0.5") as c:
        chunked = b"%x\r\n%s\r\n0\r\nAuthorization: Bearer %s\r\n\r\n" % (
            len(TEXT), TEXT, KEY.encode())  # fmt: skip
        c.send(b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
               b"Trailer: Authorization\r\n\r\n" + chunked)  # fmt: skip
        assert c.response().status == 401
        c.send(post(TEXT, AUTH))  # the same key in the head does
        assert c.response().status == 200
    served(keyed)


def test_chunk_extensions_count_toward_the_body_limit(keyed: ServerProc) -> None:
    """One byte of data behind 96 KiB of chunk extension, under a 64 KiB --max-body."""
    with Raw(keyed.port) as c:
        c.send(b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\n" + AUTH.encode()
               + b"Transfer-Encoding: chunked\r\n\r\n1;x=")  # fmt: skip
        for _ in range(12):
            if not c.send(b"a" * 8192):
                break  # refused and closed while it was still sending
        resp = c.response()
        assert resp.status == 413 and b"as sent" in resp.body, resp
    served(keyed)


def test_a_half_closed_client_gets_its_answers(keyed: ServerProc) -> None:
    """Three pipelined requests, then SHUT_WR: every answer comes, after an interim 100 (every
    HTTP/1.1 client skips one), then the server closes."""
    with Raw(keyed.port) as c:
        c.send(post(TEXT, AUTH) * 3)
        c.sock.shutdown(socket.SHUT_WR)
        statuses = []
        while len(statuses) < 3:
            resp = c.response()
            if resp.status != 100:
                statuses.append(resp.status)
        assert statuses == [200, 200, 200]
        assert c.closed_by_server()
    served(keyed)


def test_idle_time_counts_from_the_last_answer(keyed: ServerProc) -> None:
    """A request answered 1.5 s after it came (its worker held), on a --keepalive-timeout-s 2
    connection: 1.2 s after the answer (2.7 s after the request: closed by then, were idle time
    counted from the request) the connection still serves, and every kept-alive answer says
    when it will be closed."""
    rows = keyed.ctl({"cmd": "status", "key": KEY})["workers"]
    (pid,) = {w["pid"] for w in rows if w["id"] >= 0}
    with Raw(keyed.port) as c:
        os.kill(pid, signal.SIGSTOP)
        try:
            c.send(post(TEXT, AUTH))
            time.sleep(1.5)
        finally:
            os.kill(pid, signal.SIGCONT)
        resp = c.response()
        assert resp.status == 200 and resp.headers["keep-alive"] == "timeout=2", resp.headers
        time.sleep(1.2)
        c.send(post(TEXT, AUTH))
        assert c.response().status == 200
        c.sock.settimeout(KEEPALIVE_S + 3)
        t0 = time.monotonic()
        assert c.closed_by_server()  # and then it is idle: closed after its timeout
        assert time.monotonic() - t0 >= KEEPALIVE_S - 0.3


def test_http10_keep_alive_is_echoed(keyed: ServerProc) -> None:
    with Raw(keyed.port) as c:
        one = b"GET /v2/health/ready HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
        c.send(one)
        resp = c.response()
        assert resp.status == 200 and resp.headers["connection"] == "keep-alive", resp.headers
        assert resp.headers["keep-alive"] == "timeout=2"
        c.send(b"GET /v2/health/ready HTTP/1.0\r\n\r\n")  # the same connection, kept
        resp = c.response()
        assert resp.status == 200 and resp.headers["connection"] == "close"
        assert c.closed_by_server()


@pytest.mark.parametrize(
    ("host", "extra", "status"),
    [
        ("localhost", "", 200),
        ("127.0.0.1", "", 200),
        ("[::1]", "", 200),
        ("evil.example", "", 400),  # DNS rebinding: a page's own name, pointed at loopback
        ("localhost", "Origin: https://evil.example\r\nContent-Type: text/plain\r\n", 403),
        ("localhost", "Origin: null\r\n", 403),
        ("localhost", "Origin: http://localhost:3000\r\n", 200),
    ],
    ids=["localhost", "127.0.0.1", "::1", "rebinding", "cross-origin", "null-origin", "local-page"],
)
def test_hosts_and_origins_on_a_keyless_loopback_server(
    keyless: ServerProc, host: str, extra: str, status: int
) -> None:
    with Raw(keyless.port) as c:
        c.send(post(TEXT, extra, host=f"{host}:{keyless.port}"))
        resp = c.response()
        assert resp.status == status, resp
        if status != 200:
            c.send(post(TEXT))  # a refusal keeps the connection
            assert c.response().status == 200
    served(keyless, key=False)


def test_a_cross_origin_request_with_a_key_is_answered(keyed: ServerProc) -> None:
    with Raw(keyed.port) as c:
        c.send(post(TEXT, "Origin: https://app.example\r\n"))
        assert c.response().status == 403  # no key: refused before the key is even asked
        c.send(post(TEXT, "Origin: https://app.example\r\n" + AUTH))
        assert c.response().status == 200


def test_failed_keys_are_throttled_by_address(keyed: ServerProc) -> None:
    """From 127.0.0.9: FAILURES wrong keys are 401, then every request is 429 with Retry-After
    (the right key too: it is not checked), and its binary connections are closed unread; other
    addresses are served meanwhile, and after the wait one attempt goes through again."""
    source = "127.0.0.9"
    with Raw(keyed.port, source=source) as c:
        for k in range(FAILURES):
            c.send(post(TEXT, f"Authorization: Bearer guess{k}\r\n"))
            assert c.response().status == 401
        c.send(post(TEXT, AUTH))
        resp = c.response()
        assert resp.status == 429 and int(resp.headers["retry-after"]) >= 1, resp
    served(keyed)  # from 127.0.0.1
    binary = socket.create_connection(("127.0.0.1", keyed.binary_port), 10, (source, 0))
    binary.sendall(encode_frame(AUTH_PREFIX + KEY.encode(), 0) + encode_frame("a film", 1))
    binary.settimeout(10)
    assert binary.recv(64) == b""  # closed, unanswered
    binary.close()
    time.sleep(WINDOW_S / FAILURES + 0.5)  # one attempt refilled
    with Raw(keyed.port, source=source) as c:
        c.send(post(TEXT, AUTH))
        assert c.response().status == 200
    with socket.create_connection(("127.0.0.1", keyed.binary_port), 10) as ok:  # another address
        ok.sendall(encode_frame(AUTH_PREFIX + KEY.encode(), 0) + encode_frame("a film", 1))
        data = b""
        while len(parse_answers(data)[0]) < 2:
            chunk = ok.recv(4096)
            assert chunk, data
            data += chunk
    assert [a.tag for a in parse_answers(data)[0]] == [0, 1]
