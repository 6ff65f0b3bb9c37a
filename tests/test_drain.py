"""The drain on SIGTERM: readiness turns 503 first (--shutdown-delay-s) while serving goes on, then
open connections are still served and told `connection: close`; idle ones close at the deadline."""

from __future__ import annotations

import http.client
import json
import signal
import socket

from service.wire import encode_frame, parse_answers
from tests.conftest import wait_for


def post(conn: http.client.HTTPConnection, text: str) -> tuple[int, str | None, bytes]:
    conn.request("POST", "/v1/classify", json.dumps({"text": text}))
    resp = conn.getresponse()
    return resp.status, resp.getheader("connection"), resp.read()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_keepalive_client_is_served_through_the_drain(start_server) -> None:  # type: ignore[no-untyped-def]
    srv = start_server(
        "--workers", "1", "--spares", "0", "--shutdown-delay-s", "1.5", "--drain-timeout-s", "6",
        workers=1,
    )  # fmt: skip
    busy = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    idle = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    binary = socket.create_connection(("127.0.0.1", srv.binary_port), timeout=30)
    assert post(busy, "a fine film")[:2] == (200, None)
    assert post(idle, "a fine film")[:2] == (200, None)
    srv.proc.send_signal(signal.SIGTERM)

    # The shutdown delay: not ready, yet serving as usual, connections kept alive.
    wait_for(lambda: srv.request("GET", "/v2/health/ready")[0] == 503, 10, "readiness 503")
    during_delay = post(busy, "still serving")
    assert during_delay[:2] == (200, None), during_delay

    # The drain: the listener is closed; a request on an open connection is served, then closed.
    wait_for(lambda: refused(srv.port), 10, "listener closed")
    status, connection, body = post(busy, "served while draining")
    print(f"drain: keep-alive request answered {status}, connection: {connection}")
    assert status == 200, body
    assert connection == "close"
    assert json.loads(body)["label"]

    # A binary connection owed nothing is closed at once (EOF, no answer).
    binary.settimeout(10)
    assert binary.recv(64) == b""
    binary.close()

    # The idle keep-alive connection is closed at the drain's deadline; then the server exits 0.
    assert srv.proc.wait(30) == 0
    idle.sock.settimeout(5)  # type: ignore[union-attr]
    assert idle.sock.recv(64) == b""  # type: ignore[union-attr]
    busy.close()
    idle.close()
    assert srv.stop() == 0


def test_binary_answers_owed_then_closes(start_server) -> None:  # type: ignore[no-untyped-def]
    """Frames read before the drain are answered, each one, and then the connection closes."""
    srv = start_server("--workers", "1", "--spares", "0", workers=1)
    sock = socket.create_connection(("127.0.0.1", srv.binary_port), timeout=60)
    text = ("a long and winding review of a film that goes on " * 20).encode()
    n = 64
    sock.sendall(b"".join(encode_frame(text, t) for t in range(n)))
    wait_for(lambda: srv.status()["queue_depth"] > 0, 30, "frames in flight")
    srv.proc.send_signal(signal.SIGTERM)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    answers, used = parse_answers(data)
    assert used == len(data), "a partial answer"
    assert all(a.ok for a in answers), [a for a in answers if not a.ok]
    tags = [a.tag for a in answers]
    print(f"drain: binary frames sent {n}, answered {len(tags)} (status 0), then EOF")
    assert sorted(tags) == list(range(n))
    sock.close()
    assert srv.proc.wait(60) == 0
    assert srv.stop() == 0
