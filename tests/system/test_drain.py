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
import threading
import time
from collections import Counter
from dataclasses import dataclass

import psutil
import pytest
from ringserve.wire.frames import encode_frame, parse_answers

from devkit.http import get_json
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
            90,  # past the warm-up's own 60 s bound (pool/warmup.py): a failed roll says why
            "every worker replaced by the reload",
            detail=lambda: pool_story(srv),
        )
    assert set(load.outcomes) == {"200"}, load.outcomes  # every request answered, and 200
    seen = events(srv.logs())
    died = [e for e in seen if e.get("event") == "worker_died" and e.get("exit_code") != 0]
    assert not died, died  # retired workers exit 0; none was killed by the signal
    # nor multiprocessing's resource tracker, which once died of it and, started again empty,
    # printed a KeyError traceback for each segment unlinked after (lifecycle.py)
    assert "Traceback" not in srv.logs(), srv.logs()[-3000:]
    assert srv.stop() == 0


def pool_story(srv) -> str:
    """The workers now, and the pool's events: what a stalled roll was waiting for."""
    kinds = ("worker", "zygote", "reload", "roll", "spare")
    seen = [e for e in events(srv.logs()) if str(e.get("event", "")).startswith(kinds)]
    rows = [
        {k: w.get(k) for k in ("id", "pid", "state", "inflight")} for w in srv.status()["workers"]
    ]
    return f"workers: {rows}\nevents:\n" + "\n".join(json.dumps(e) for e in seen[-40:])


# -- issue 56: a drain answers what it has read ---------------------------------------------------
LONG_REVIEW = "a long and winding review of a film that goes on and on about nothing much " * 13
DRAIN_ROUNDS = int(os.environ.get("RINGSERVE_DRAIN_ROUNDS", "2"))  # the acceptance: 20


@dataclass
class Sent:
    sent: float  # monotonic seconds: the request's last byte written
    answered: float = 0.0
    status: int | str = 0  # the answer's code, or the error that ended the connection
    closed: bool = False  # the answer said `connection: close`
    body: bytes = b""  # of an answer that is not 200
    retry_after: bool = False  # the answer said when to retry
    latency_s: float = 0.0  # x-latency-ms: from the server's read of its last byte to its answer

    def read_before(self, t: float) -> bool:
        """The server had read it all before `t` (it read it `latency_s` before it answered,
        and answered before the client saw the answer)."""
        return bool(self.answered) and self.answered - self.latency_s < t

    def written_after(self, t: float) -> bool:
        """The server wrote its answer after `t` (it read it after it was sent)."""
        return bool(self.answered) and self.sent + self.latency_s > t


class ClosedLoop:
    """`clients` raw keep-alive connections, each sending its next request of `batch` texts
    (an eighth of them long) as soon as its last answer is in: every request is kept with
    when it was sent and answered."""

    def __init__(self, port: int, texts: list[str], clients: int = 8, batch: int = 16) -> None:
        self.port, self.texts, self.batch = port, texts, batch
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.sent: list[Sent] = []
        self.threads = [threading.Thread(target=self.run, args=(k,), daemon=True)
                        for k in range(clients)]  # fmt: skip

    def body(self, i: int) -> bytes:
        texts = [self.texts[(i * self.batch + k) % len(self.texts)] for k in range(self.batch)]
        for k in range(0, self.batch, 8):
            texts[k] = LONG_REVIEW
        body = json.dumps({"texts": texts}).encode()
        head = b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n"
        return head % len(body) + body

    def run(self, k: int) -> None:
        sock: socket.socket | None = None
        i = k
        while not self.stop_event.is_set():
            i += len(self.threads)
            try:
                sock = sock or socket.create_connection(("127.0.0.1", self.port), timeout=60)
            except OSError:
                return  # the listener closed: the drain has begun
            sock.sendall(self.body(i))
            record = Sent(time.monotonic())
            with self.lock:
                self.sent.append(record)
            try:
                status, headers, body = read_answer(sock)
            except OSError as exc:
                status, headers, body = type(exc).__name__, {"connection": "close"}, b""
            record.answered, record.status = time.monotonic(), status
            record.closed = headers.get("connection") == "close"
            record.retry_after = "retry-after" in headers
            record.latency_s = float(headers.get("x-latency-ms", 0)) / 1000
            record.body = body if status != 200 else b""
            closed = record.closed
            if closed:
                sock.close()
                sock = None
            if status == 503:
                self.stop_event.wait(1.0)  # its Retry-After
        if sock is not None:
            sock.close()

    def answered(self) -> int:
        with self.lock:
            return sum(1 for r in self.sent if r.answered)

    def wait_answered(self, more: int) -> None:
        target = self.answered() + more
        wait_for(lambda: self.answered() >= target, 60, f"{more} more answers")


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One answer's status, headers (names in lower case) and body."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed before an answer")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(ln.split(b":")[1]) for ln in lines if ln.startswith(b"content-length:"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed inside an answer")
        rest += chunk
    headers = dict(ln.decode().split(":", 1) for ln in lines[1:])
    headers = {k.strip(): v.strip() for k, v in headers.items()}
    return int(lines[0].split()[1]), headers, rest[:length]


def test_sigterm_under_closed_loop_load_answers_every_request_it_read(
    start_server, sst2_texts
) -> None:
    """Issue 56: 8 closed-loop clients of 16 texts (an eighth long), SIGTERM; every request
    sent before the signal (20 ms before, so that it was read) and not answered before it is
    answered 200, with `connection: close`. Each round makes the case that used to fail: the
    worker held until the queue has stood an interval (250 ms), and the requests admitted next get a
    queue bound (admission refuses a text still waiting past it, 0.9 s, to keep the queue's
    delay down); then the worker held again across the signal for 1.3 s. A request in flight at
    the signal is answered whatever it waits: only a request read after it may be refused.
    RINGSERVE_DRAIN_ROUNDS rounds (default 2; the issue's acceptance ran 20). One round is
    enough to fail: with the bounds kept through the drain (Admission.keep_admitted a no-op),
    a single round answered 503 to requests in flight, twice in two runs."""
    for round_ in range(DRAIN_ROUNDS):
        srv = start_server("--spares", "0", "--heartbeat-timeout-s", "60")
        load = ClosedLoop(srv.port, sst2_texts)
        for t in load.threads:
            t.start()
        load.wait_answered(16)
        (pid,) = set(srv.worker_pids().values())
        os.kill(pid, signal.SIGSTOP)
        try:
            stood = lambda port=srv.port: get_json(port, "/v1/stats")["queue_wait_ms"] > 250  # noqa: E731
            wait_for(stood, 30, "a standing queue")  # what is admitted next gets a queue bound
            os.kill(pid, signal.SIGCONT)
            load.wait_answered(4)  # 4 more answered, so 4 more admitted into that queue
            os.kill(pid, signal.SIGSTOP)  # what is in flight waits past its bound
            signalled = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(1.3)  # a duration, not a wait: past the queue bound (0.9 s) of each
        finally:
            os.kill(pid, signal.SIGCONT)
        code = srv.proc.wait(60)
        load.stop_event.set()
        for t in load.threads:
            t.join(30)
        # In flight at the signal: sent 20 ms before it, read before it and answered after it,
        # each told by the answer's x-latency-ms (the server's own time from its read of the
        # last byte to its answer), not by when a client thread on this busy machine got to it.
        sent = [r for r in load.sent if r.sent < signalled - 0.02]
        in_flight = [r for r in sent if r.read_before(signalled) and r.written_after(signalled)]
        lost = [r for r in sent if isinstance(r.status, str) and r.sent < signalled - 0.2]
        before = [r for r in load.sent if r.answered and r.answered < signalled]
        print(f"round {round_ + 1}/{DRAIN_ROUNDS}: {len(in_flight)} in flight at the signal, "
              f"{sorted({str(r.status) for r in in_flight})}; before it "
              f"{sorted({str(r.status) for r in before})}; exit {code}")  # fmt: skip
        refusals = Counter(r.body[:40] for r in before + in_flight if r.status != 200)
        print(f"  refused: {dict(refusals)}")
        assert code == 0
        assert in_flight, "no request in flight at the signal"
        assert [r.status for r in in_flight] == [200] * len(in_flight), in_flight
        assert not lost, lost  # read (sent 200 ms before the signal), never answered
        draining = signalled + 0.1  # the drain began within this of the signal
        assert all(r.closed for r in in_flight if r.written_after(draining)), in_flight
        after = [r for r in load.sent if r.status == 503 and r.written_after(draining)]
        assert all(r.closed and r.retry_after for r in after), after  # read after it: may be 503
        assert srv.stop() == 0
