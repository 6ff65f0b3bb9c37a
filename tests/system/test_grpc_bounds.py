"""What one gRPC connection may hold, attacked from outside against real keyed servers (issue 56,
items 1 and 6 for gRPC): one connection with no key that opens streams with parts of messages,
never reads an answer and floods reflection, while an HTTP and a gRPC client classify; a
thousand idle connections; the key checked on a call's headers, before any of its message; and
a client that leaves with its calls queued, whose texts never reach a worker.

Raw frames over plain sockets (devkit/h2flood.py's), the front-end's memory read from /proc
(psutil), the normal clients' latencies measured around each attack. The limits are the
documented ones (docs/api.md, "KServe v2 over gRPC"), some set small here to keep it short."""

from __future__ import annotations

import http.client
import json
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import hpack
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from grpc_reflection.v1alpha import reflection_pb2
from tritonclient.utils import InferenceServerException

from devkit import h2flood
from devkit.h2flood import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PREFACE,
    REFLECTION,
    RST_STREAM,
    SETTINGS,
    data_frames,
    frame,
    grpc_message,
)
from devkit.load import percentile
from devkit.server import ServerProc, serving, wait_for

KEY = "bounds-key"
AUTH = {"authorization": f"Bearer {KEY}"}
MAX_CONNECTIONS = 64
READ_TIMEOUT_S = 2.0
IDLE_S = 3.0
WRITE_TIMEOUT_S = 3.0
SERVER_ARGS = [
    "--workers", "1", "--spares", "0",
    "--max-connections", str(MAX_CONNECTIONS),
    "--read-timeout-s", str(READ_TIMEOUT_S),
    "--grpc-idle-timeout-s", str(IDLE_S),
    "--write-timeout-s", str(WRITE_TIMEOUT_S),
]  # fmt: skip
BUDGET = 8 << 20  # --grpc-buffer's default
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
TEXT = "a gripping, beautifully acted film"
SWEEP_SLACK_S = 2.0  # the sweep's quarter second, and a busy shared machine
ENHANCE_YOUR_CALM = 11


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    with serving(
        ServerProc(
            tmp_path_factory.mktemp("grpc-bounds"),
            SERVER_ARGS,
            env={"RINGSERVE_API_KEY": KEY},
            grpc=True,
        )
    ) as server:
        yield server


@pytest.fixture(scope="module")
def model(srv: ServerProc) -> str:
    status, _, body = srv.request("GET", "/v1/model", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200, body
    name: str = json.loads(body)["name"]
    return name


# -- the normal clients -----------------------------------------------------------------------
@dataclass
class Probe:
    """One HTTP (/v1/classify, keep-alive) and one gRPC (tritonclient ModelInfer) client with
    the key, each calling in a closed loop: (start, latency s, ok) per call."""

    http_port: int
    grpc_port: int
    model: str
    calls: dict[str, list[tuple[float, float, bool]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Probe:
        self.calls = {"http": [], "grpc": []}
        self.threads = [
            threading.Thread(target=self.http_loop, daemon=True),
            threading.Thread(target=self.grpc_loop, daemon=True),
        ]
        for t in self.threads:
            t.start()
        wait_for(lambda: all(self.ok(k) >= 5 for k in self.calls), 30, "probes answered")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def ok(self, kind: str) -> int:
        return sum(1 for _, _, ok in self.calls[kind] if ok)

    def http_loop(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        body = json.dumps({"text": TEXT})
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                conn.request("POST", "/v1/classify", body, headers)
                resp = conn.getresponse()
                ok = resp.status == 200 and b"label" in resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
                ok = False
            self.calls["http"].append((t0, time.monotonic() - t0, ok))
        conn.close()

    def grpc_loop(self) -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")
        inp = grpcclient.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([TEXT.encode()], dtype=object))
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                result = client.infer(self.model, [inp], headers=AUTH, client_timeout=30)
                ok = result.as_numpy("label") is not None
            except InferenceServerException:
                ok = False
            self.calls["grpc"].append((t0, time.monotonic() - t0, ok))
        client.close()

    def window(self, kind: str, t0: float, t1: float) -> tuple[list[float], int]:
        """Latencies in ms of the calls started between t0 and t1, and how many failed."""
        got = [(lat, ok) for start, lat, ok in self.calls[kind] if t0 <= start < t1]
        return [lat * 1000 for lat, ok in got if ok], sum(1 for _, ok in got if not ok)


def front_rss(srv: ServerProc) -> int:
    return int(psutil.Process(srv.pid).memory_info().rss)


def held_by_server(srv: ServerProc, port: int) -> set[int]:
    """The client ports of the connections the server process holds on `port`."""
    conns = psutil.Process(srv.pid).net_connections("tcp")
    return {c.raddr.port for c in conns if c.laddr and c.laddr.port == port and c.raddr}


# -- raw HTTP/2 -------------------------------------------------------------------------------
def call_block(path: str, key: str | None = None) -> bytes:
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
              ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
    if key is not None:
        fields.append(("authorization", f"Bearer {key}"))
    never = [hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields]
    return bytes(hpack.Encoder().encode(never, huffman=False))


def read_frames(buf: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while len(buf) - pos >= 9:
        n = int.from_bytes(buf[pos : pos + 3])
        if len(buf) - pos < 9 + n:
            break
        kind, flags = buf[pos + 3], buf[pos + 4]
        sid = int.from_bytes(buf[pos + 5 : pos + 9]) & 0x7FFFFFFF
        out.append((kind, flags, sid, buf[pos + 9 : pos + 9 + n]))
        pos += 9 + n
    return out


def statuses(frames: list[tuple[int, int, int, bytes]]) -> dict[int, str]:
    """Each stream's grpc-status, from the server's header blocks (literals, no table)."""
    decoder = hpack.Decoder()
    got = {}
    for kind, _flags, sid, payload in frames:
        if kind == HEADERS:
            fields = dict(decoder.decode(payload))
            if "grpc-status" in fields:
                got[sid] = fields["grpc-status"]
    return got


def drain(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the server sent, read until it closes or `seconds` pass: (bytes, closed)."""
    sock.setblocking(True)
    sock.settimeout(0.2)
    got = bytearray()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except OSError:
            return bytes(got), True
        if not data:
            return bytes(got), True
        got += data
    return bytes(got), False


# -- the attack of the acceptance -------------------------------------------------------------
class Sampler(threading.Thread):
    """The front-end's RSS every 20 ms until stopped: its peak over the attack."""

    def __init__(self, srv: ServerProc) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(srv.pid)
        self.before = self.peak = int(self.process.memory_info().rss)
        self.halt = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.halt.wait(0.02):
            self.peak = max(self.peak, int(self.process.memory_info().rss))

    def stop(self) -> int:
        """The growth at the peak."""
        self.halt.set()
        self.join(5)
        return self.peak - self.before


@pytest.mark.parametrize("reconnect", [False, True], ids=["one", "reconnecting"])
def test_a_connection_that_holds_parts_reads_nothing_and_floods_reflection_is_bounded(
    srv: ServerProc, model: str, reconnect: bool
) -> None:
    """Acceptance (issue 56): one connection, no key, that holds parts of messages on 112
    streams (6.7 MB of its 8 MiB window), never reads, and floods reflection (devkit/h2flood.py's
    "parts-reflection", from a process of its own): the front-end grows under 64 MiB, the
    connection is closed, and the other clients' classify P99 stays under 100 ms (over 3 s
    from the attack's start; on a machine too busy for that, the P99 of the 3 s before the
    attack over 50 ms, twice that P99 is the limit instead). `reconnecting`: a new such
    connection each time one is closed, for 4 s (each is closed in about 0.05 s, so dozens of
    them; were what each holds kept, ten would pass the bound): memory bounded the same, every
    connection closed, the others served without a failure (their latency printed, not bounded
    here: benchmarks measure it)."""
    attack = h2flood.Attack(srv.grpc_port, "parts-reflection", reconnect=reconnect,
                            duration=4.0 if reconnect else 10.0)  # fmt: skip
    with Probe(srv.port, srv.grpc_port, model) as probe:
        time.sleep(3.0)
        sampler = Sampler(srv)
        t0 = time.monotonic()
        attack = attack.elsewhere()
        t1 = max(time.monotonic(), t0 + 3.0)
        while time.monotonic() < t1:
            time.sleep(0.1)
        growth = sampler.stop()
    conns = attack.connections
    print(f"\n{len(conns)} attacking connections, RSS +{growth / 2**20:.1f} MiB at the peak; "
          f"the first: {conns[0]}")  # fmt: skip
    assert growth < 64 * 2**20, f"the front-end grew {growth / 2**20:.0f} MiB"
    # GOAWAY NO_ERROR: a connection the attack's end cut short, idle once its parts timed out
    odd = [c for c in conns if not c.closed or c.goaway not in (None, 0, ENHANCE_YOUR_CALM)]
    assert conns and not odd, odd
    for kind in ("http", "grpc"):
        lats, failed = probe.window(kind, t0, t1)
        base, _ = probe.window(kind, t0 - 3.0, t0)
        p99, quiet = percentile(lats, 99), percentile(base, 99)
        print(f"{kind}: {len(lats)} calls, P50 {percentile(lats, 50):.1f} P99 {p99:.1f} "
              f"max {max(lats):.1f} ms, {failed} failed; before: P99 {quiet:.1f} ms")  # fmt: skip
        assert failed == 0 and len(lats) > 50
        if not reconnect:  # the acceptance's bound, robust to a busy shared machine
            limit = max(100, 2 * quiet)
            assert p99 < limit, f"{kind} P99 {p99:.0f} ms in the attack (before: {quiet:.0f})"
    wait_for(lambda: not held_by_server(srv, srv.grpc_port), 5, "the attacker's connections closed")


def test_parts_past_the_budget_end_their_stream_resource_exhausted(srv: ServerProc) -> None:
    """Parts of messages (60 KB of 2 MB, each within its stream's 64 KiB) on 140 streams that
    spend the connection's 8 MiB window exactly, as a client that keeps to it may: the stream
    that spent it ends RESOURCE_EXHAUSTED (its bytes given back) and the connection goes on;
    the others' parts stop coming and the read timeout ends each DEADLINE_EXCEEDED, giving
    back what they held."""
    sock = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    reflect = call_block(REFLECTION)
    out = PREFACE + frame(SETTINGS, 0, 0)
    part = struct.pack(">BI", 0, 2_000_000) + bytes(60_000)
    n = BUDGET // len(part)
    sids = [1 + 2 * i for i in range(n + 1)]
    for sid in sids[:-1]:
        out += frame(HEADERS, END_HEADERS, sid, reflect) + data_frames(sid, part)
    last = part[: BUDGET - n * len(part)]  # the rest of the window, to its last byte
    out += frame(HEADERS, END_HEADERS, sids[-1], reflect) + data_frames(sids[-1], last)
    sender = threading.Thread(target=lambda: sock.sendall(out), daemon=True)
    sender.start()
    buf, got = b"", {}
    until = time.monotonic() + READ_TIMEOUT_S + SWEEP_SLACK_S + 5
    while len(got) < len(sids) and time.monotonic() < until:
        data = sock.recv(1 << 16)
        assert data, f"closed before every stream was answered: {got}"
        buf += data
        got = statuses(read_frames(buf))
    sender.join(5)
    sock.close()
    assert got.get(sids[-1]) == "8", got  # the stream that spent the window
    assert got == {**dict.fromkeys(sids[:-1], "4"), sids[-1]: "8"}, got


# -- idle connections -------------------------------------------------------------------------
def test_a_thousand_idle_connections_are_capped_then_closed(srv: ServerProc, model: str) -> None:
    """1,000 connections that send nothing (or the preface and SETTINGS, then nothing): the
    server holds at most --max-connections of them, GOAWAY "too many connections" to the rest
    at once, and closes those it took after --read-timeout-s (no preface) or
    --grpc-idle-timeout-s (no call); a keyed client is served after."""
    socks = []
    for i in range(1000):
        s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
        if i % 2:
            s.sendall(PREFACE + frame(SETTINGS, 0, 0))
        socks.append(s)
    most = 0
    until = time.monotonic() + 1.0
    while time.monotonic() < until:
        most = max(most, len(held_by_server(srv, srv.grpc_port)))
        time.sleep(0.1)
    seen: dict[socket.socket, bytearray] = {s: bytearray() for s in socks}
    open_ = set(socks)
    until = time.monotonic() + max(READ_TIMEOUT_S, IDLE_S) + SWEEP_SLACK_S + 2
    while open_ and time.monotonic() < until:
        ready, _, _ = select.select(list(open_), [], [], 0.2)
        for s in ready:
            try:
                data = s.recv(1 << 16)
            except OSError:
                data = b""
            if data:
                seen[s] += data
            else:
                open_.discard(s)
    for s in socks:
        s.close()
    debug = [
        bytes(p[8:])
        for buf in seen.values()
        for k, _f, _s, p in read_frames(bytes(buf))
        if k == GOAWAY
    ]
    too_many = sum(1 for d in debug if d == b"too many connections")
    print(f"\n1,000 idle: at most {most} held, {too_many} refused, {len(open_)} left open")
    assert most <= MAX_CONNECTIONS
    assert too_many >= 1000 - MAX_CONNECTIONS
    assert not open_, f"{len(open_)} idle connections still open"
    wait_for(lambda: not held_by_server(srv, srv.grpc_port), 5, "no gRPC connection held")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    inp = grpcclient.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array([TEXT.encode()], dtype=object))
    assert client.infer(model, [inp], headers=AUTH).as_numpy("label") is not None
    client.close()


# -- the key, on the headers ------------------------------------------------------------------
@pytest.mark.parametrize("key", [None, "wrong"])
def test_the_key_is_checked_on_the_headers_before_any_message(
    srv: ServerProc, key: str | None
) -> None:
    """A ModelInfer without a (right) key is answered UNAUTHENTICATED on its headers alone,
    before a byte of its message; health and reflection stay open without one."""
    sock = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    infer = call_block(h2flood.MODEL_INFER, key)
    sock.sendall(
        PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, infer)
        + frame(HEADERS, END_HEADERS, 3, call_block(HEALTH_CHECK))
        + frame(DATA, END_STREAM, 3, grpc_message(b""))
        + frame(HEADERS, END_HEADERS, 5, call_block(REFLECTION))
        + frame(DATA, END_STREAM, 5, grpc_message(
            reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()))
    )  # fmt: skip
    got: dict[int, str] = {}
    buf = b""
    until = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < until:
        buf += sock.recv(1 << 16)
        got = statuses(read_frames(buf))
    sock.close()
    assert got == {1: "16", 3: "0", 5: "0"}, got


# -- a client that leaves -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    """A server whose queue takes 10 calls of 256 texts whole."""
    args = ["--workers", "1", "--spares", "0", "--max-queue", "4096", "--max-queue-ms", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("grpc-leave"), args, grpc=True)) as server:
        yield server


def metric(srv: ServerProc, name: str, *labels: str) -> float:
    """The sum of a metric's samples that carry every one of `labels` (`code="499"`)."""
    status, _, body = srv.request("GET", "/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if re.split(r"[{ ]", line, maxsplit=1)[0] == name and all(x in line for x in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rows_run(srv: ServerProc) -> float:
    """Texts the workers have run, once nothing admitted is owed: a worker counts a batch
    before it sends its answers (workers/process/answers.py), a text in a ring is owed until
    answered, and a dropped one was never in a ring. (It waited for the count to stand still
    for 2 s, twice a test.)"""
    wait_for(lambda: metric(srv, "ringserve_queue_depth") == 0, 60, "nothing owed")
    return metric(srv, "ringserve_batch_size_sum")


@pytest.mark.parametrize("how", ["reset", "disconnect"])
def test_a_client_that_leaves_has_its_queued_texts_dropped(
    deep: ServerProc, agnews_texts: list[str], how: str
) -> None:
    """10 ModelInfer calls of 256 texts each, then RST_STREAM on each (or the connection
    closed): fewer than 512 of the 2,560 texts reach a worker (issue 56's acceptance), the
    rest are dropped where they wait; the calls count as 499."""
    _, _, body = deep.request("GET", "/v1/model")
    model = json.loads(body)["name"]
    base_rows, base_499 = rows_run(deep), metric(deep, "ringserve_requests_total", 'code="499"')
    from tritonclient.grpc import service_pb2

    texts = [t.encode() for t in (agnews_texts * 3)[:256]]
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="text", datatype="BYTES", shape=[256])
    request.raw_input_contents.append(b"".join(struct.pack("<I", len(t)) + t for t in texts))
    message = grpc_message(request.SerializeToString())
    block = call_block(h2flood.MODEL_INFER)
    out = PREFACE + frame(SETTINGS, 0, 0)
    for i in range(10):
        out += frame(HEADERS, END_HEADERS, 1 + 2 * i, block) + data_frames(
            1 + 2 * i, message, end=True
        )
    sock = socket.create_connection(("127.0.0.1", deep.grpc_port), timeout=10)
    sock.sendall(out)
    wait_for(lambda: metric(deep, "ringserve_queue_depth") >= 2000, 10, "the calls queued")
    if how == "reset":
        cancel = struct.pack(">I", 8)
        sock.sendall(b"".join(frame(RST_STREAM, 0, 1 + 2 * i, cancel) for i in range(10)))
        time.sleep(0.5)
    sock.close()
    ran = rows_run(deep) - base_rows
    cancelled = metric(deep, "ringserve_requests_total", 'code="499"') - base_499
    print(f"\n{how}: {ran:.0f} of 2,560 texts reached a worker; {cancelled:.0f} calls 499")
    assert ran < 512
    assert cancelled >= 8
    assert deep.classify("still serving")["label"]


def test_the_limits_are_documented_once() -> None:
    """--grpc-buffer and --grpc-idle-timeout-s come from settings.py, and docs/api.md names
    them in its gRPC section."""
    from devkit.launcher import ROOT

    api = (ROOT / "docs" / "api.md").read_text()
    section = api[api.index("## KServe v2 over gRPC") : api.index("## Embeddings and reranking")]
    for flag in ("--grpc-buffer", "--grpc-idle-timeout-s", "--max-connections",
                 "--read-timeout-s", "--write-timeout-s"):  # fmt: skip
        assert flag in section, flag
    assert re.search(r"RESOURCE_EXHAUSTED", section)
