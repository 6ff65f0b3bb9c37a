"""The drain on SIGTERM: readiness turns 503 first (--shutdown-delay-s) while serving goes on, then
idle connections close at once, and a request in flight is answered with `connection: close`; the
server exits as soon as nothing is owed."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import time

import psutil
import pytest
from ringserve.wire.frames import encode_frame, parse_answers

from devkit.load import Load
from devkit.server import refused, wait_for


def post(conn: http.client.HTTPConnection, text: str) -> tuple[int, str | None, bytes]:
    conn.request("POST", "/v1/classify", json.dumps({"text": text}))
    resp = conn.getresponse()
    return resp.status, resp.getheader("connection"), resp.read()


def closed_by_peer(sock: socket.socket) -> bool:
    """The server closed this idle connection (EOF, or a reset)."""
    try:
        return sock.recv(64) == b""
    except ConnectionResetError:
        return True


def test_keepalive_client_is_served_through_the_drain(start_server) -> None:
    """Through the shutdown delay a keep-alive client is served as usual; when the drain begins
    its idle connection is closed at once (as uvicorn and Go's Shutdown do), while a request in
    flight on another is answered, with `connection: close`."""
    srv = start_server(
        "--workers", "1", "--spares", "0", "--shutdown-delay-s", "1.5", "--drain-timeout-s", "30",
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

    # A request in flight when the drain begins (its worker held still until then).
    (pid,) = srv.worker_pids().values()
    os.kill(pid, signal.SIGSTOP)
    try:
        busy.request("POST", "/v1/classify", json.dumps({"text": "served while draining"}))
        wait_for(lambda: srv.status()["queue_depth"] == 1, 10, "the request in flight")
        # The drain: the listener closes, and so do the idle connections, HTTP and binary.
        wait_for(lambda: refused(srv.port), 10, "listener closed")
        idle.sock.settimeout(5)
        assert closed_by_peer(idle.sock)
        binary.settimeout(5)
        assert closed_by_peer(binary)
    finally:
        os.kill(pid, signal.SIGCONT)
    resp = busy.getresponse()
    status, connection, body = resp.status, resp.getheader("connection"), resp.read()
    print(f"drain: request in flight answered {status}, connection: {connection}")
    assert status == 200, body
    assert connection == "close"
    assert json.loads(body)["label"]
    assert srv.proc.wait(10) == 0
    busy.close()
    idle.close()
    binary.close()
    assert srv.stop() == 0


def test_idle_connections_do_not_hold_the_exit(start_server) -> None:
    """10 idle keep-alive HTTP connections, 5 idle binary ones and one request in flight:
    SIGTERM answers the request 200 and exits 0 within 2 s, leaving nothing behind."""
    srv = start_server("--workers", "1", "--spares", "0", workers=1)
    idle_http = [http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30) for _ in range(10)]
    for conn in idle_http:
        assert post(conn, "a fine film")[0] == 200  # kept alive, as a client pool keeps it
    idle_binary = [socket.create_connection(("127.0.0.1", srv.binary_port)) for _ in range(5)]
    for k, sock in enumerate(idle_binary):
        sock.sendall(encode_frame(b"a fine film", k))
        wait_for(lambda s=sock: parse_answers(s.recv(64))[0], 10, "a binary answer")
    busy = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    (pid,) = srv.worker_pids().values()
    os.kill(pid, signal.SIGSTOP)  # so the request is still in flight at the signal
    try:
        busy.request("POST", "/v1/classify", json.dumps({"text": "in flight at the signal"}))
        wait_for(lambda: srv.status()["queue_depth"] == 1, 10, "the request in flight")
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: refused(srv.port), 5, "listener closed")
    finally:
        os.kill(pid, signal.SIGCONT)
    resp = busy.getresponse()
    assert resp.status == 200, resp.read()
    assert json.loads(resp.read())["label"]
    code = srv.proc.wait(10)
    took = time.monotonic() - t0
    print(f"drain: 10 idle HTTP + 5 idle binary + 1 in flight: exit {code} after {took:.2f} s")
    assert code == 0 and took < 2.0, (code, took)
    assert not os.path.exists(srv.control), "control socket left behind"
    for conn in idle_http:
        conn.sock.settimeout(5)
        assert closed_by_peer(conn.sock)
        conn.close()
    for sock in idle_binary:
        sock.settimeout(5)
        assert closed_by_peer(sock)
        sock.close()
    busy.close()
    assert srv.stop() == 0  # no worker and no /dev/shm segment left behind


def test_binary_answers_owed_then_closes(start_server) -> None:
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


def events(log: str) -> list[dict[str, object]]:
    out = []
    for line in log.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


@pytest.mark.parametrize(
    ("sig", "layout"),
    [(signal.SIGTERM, ("--workers", "2")), (signal.SIGINT, ())],
    ids=["SIGTERM-2-workers", "SIGINT-default-lanes"],
)
def test_a_signal_to_the_process_group_drains(start_server, sst2_texts, sig, layout) -> None:
    """SIGTERM or SIGINT to the whole process group (systemd's control-group kill, tini -g,
    `kill -TERM -PGID`) drains as the front-end's own would: workers and the zygote ignore it,
    every request is answered 200, no worker is started after it, nothing is left behind. Once
    with 2 workers of a lane, once with the default layout (on 2 cores, a worker of 2 lanes,
    whose second lane is a thread the signal must not reach either)."""
    workers = 2 if layout else None
    srv = start_server(*layout, "--drain-timeout-s", "20", workers=workers, own_group=True)
    srv.wait_spares(1)
    tracker = [p for p in srv.children() if "resource_tracker" in " ".join(p.cmdline())]
    assert tracker, "multiprocessing's resource tracker (started with the zygote)"
    with Load(srv.port, sst2_texts, clients=4, pause_s=0.005) as load:
        load.wait_ok(200)
        t0 = time.monotonic()
        os.killpg(srv.pid, sig)
        code = srv.proc.wait(30)
        took = time.monotonic() - t0
    answered = load.answered()
    rate = sum(answered.values()) / (t0 + took - load.started)
    # Once the listener is closed the clients' new connections are refused (no answer); a
    # request sent as its idle connection closed is the client's to retry.
    print(f"group {sig.name}: exit {code} after {took:.2f} s; answers {dict(answered)} "
          f"({rate:.0f}/s), unanswered {dict(load.unanswered())}")  # fmt: skip
    assert code == 0 and took < 20, (code, took)
    assert set(answered) == {"200"}, answered
    seen = events(srv.logs())
    at = next(i for i, e in enumerate(seen) if e.get("event") == "stopping")
    started = [e for e in seen[at:] if e.get("event") in ("worker_started", "zygote_started")]
    assert not started, started
    assert not [e for e in seen[at:] if e.get("event") == "worker_died"], "a worker died"
    for p in tracker:  # reaped, not a zombie left for init
        assert not psutil.pid_exists(p.pid) or p.status() != psutil.STATUS_ZOMBIE
    assert srv.stop() == 0


def test_sighup_to_the_process_group_reloads_without_a_loss(start_server, sst2_texts) -> None:
    """SIGHUP to the group reloads, worker by worker, as the front-end's own SIGHUP does; the
    workers and the zygote ignore it, so none dies of it and every request is answered 200."""
    srv = start_server("--workers", "2", workers=2, own_group=True)
    srv.wait_spares(1)
    before = set(srv.worker_pids().values())
    with Load(srv.port, sst2_texts, clients=4, pause_s=0.005) as load:
        load.wait_ok(100)
        os.killpg(srv.pid, signal.SIGHUP)
        wait_for(
            lambda: not before & set(srv.worker_pids().values()) and srv.ready_workers() == 2,
            60,
            "every worker replaced by the reload",
        )
    assert set(load.outcomes) == {"200"}, load.outcomes  # every request answered, and 200
    seen = events(srv.logs())
    died = [e for e in seen if e.get("event") == "worker_died" and e.get("exit_code") != 0]
    assert not died, died  # retired workers exit 0; none was killed by the signal
    assert srv.stop() == 0
