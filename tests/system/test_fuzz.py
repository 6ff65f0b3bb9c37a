"""Fuzzing one real server: random and mutated HTTP requests, control-socket lines and binary
frames. Every answer must be well formed and allowed by the contract, and afterwards the server
still answers a normal request with the same scores, holds no client connection, and its worker
never restarted.

RINGSERVE_FUZZ_EXAMPLES counts inputs per test (requests, lines or frames; default 1200); each
hypothesis example carries a batch of 8 to 12 of them, so the suite stays fast while `make fuzz`
(at least 100,000 per test) runs a long campaign of about 12 minutes on two cores.
"""

from __future__ import annotations

import json
import re
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ringserve.wire.frames import ANSWER, encode_frame, iter_frames, parse_answers

from devkit.fuzz import BATCH, FUZZ, INPUTS, MAX_FRAME, REFERENCE_TEXT, mutate_binary
from devkit.server import ServerProc, serving, wait_for

ALLOWED_HTTP = {100, 200, 400, 404, 405, 408, 413, 431, 503, 504}
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
pytestmark = pytest.mark.timeout(max(300, INPUTS // 50))  # the long campaign runs for minutes


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    with serving(
        ServerProc(
            tmp_path_factory.mktemp("fuzz"),
            [
                "--workers",
                "1",
                "--spares",
                "0",
                "--max-frame",
                str(MAX_FRAME),
                "--max-body",
                "65536",
            ],
        ),
        1,
    ) as server:
        yield server


def client_connections(srv: ServerProc) -> int:
    ports = {srv.port, srv.binary_port}
    conns = psutil.Process(srv.pid).net_connections("tcp")
    return sum(1 for c in conns if c.laddr and c.laddr.port in ports and c.raddr)


def reference(srv: ServerProc) -> list[float]:
    scores: list[float] = srv.classify(REFERENCE_TEXT)["scores"]
    return scores


def assert_unharmed(srv: ServerProc, pids: dict[int, int], scores: list[float]) -> None:
    """Same answer as before, no connection left, no worker restarted, nothing logged."""
    now = wait_for(lambda: reference(srv), 30, "a normal answer")
    assert max(abs(a - b) for a, b in zip(now, scores, strict=True)) < 1e-5
    wait_for(lambda: client_connections(srv) == 0, 15, "no client connections left")
    assert srv.worker_pids() == pids and srv.status()["restarts_total"] == 0
    assert "Traceback" not in srv.logs(), srv.logs()[-3000:]


def exchange(port: int, data: bytes, timeout: float = 15.0) -> tuple[bytes, bool]:
    """Send data, half-close, and read until the server closes: (bytes, reset seen)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused it early; its answer may still be there
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return out, True
            if not chunk:
                return out, False
            out += chunk


# -- HTTP -----------------------------------------------------------------------------------------
def req(method: str, path: str, headers: list[str], body: bytes = b"") -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: localhost", *headers]
    if body or method == "POST":
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(body: bytes) -> bytes:
    half = len(body) // 2
    parts = [body[:half], body[half:]]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


TEMPLATES = [
    req("POST", "/v1/classify", [], b'{"text": "a fine film"}'),
    req("POST", "/v1/classify", [], b'{"texts": ["good", "bad", "fine"]}'),
    req("GET", "/v1/model", []),
    req("GET", "/v2/health/live", ["Connection: close"]),
    req("GET", "/v2/health/ready", ["X-Request-Id: fuzz-1"]),
    req("POST", "/v1/classify", ["X-Request-Timeout-Ms: 50"], b'{"text": "quick"}'),
    req("POST", "/v1/classify", ["Expect: 100-continue"], b'{"text": "expect"}'),
    b"POST /v1/classify HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    + chunked(b'{"text": "chunks"}'),
    req("GET", "/v1/model", []) + req("POST", "/v1/classify", [], b'{"text": "pipelined"}'),
    b"GET /v1/model HTTP/1.0\r\n\r\n",
]
NASTY_HEADERS = [
    b"Content-Length: 5",
    b"Content-Length: 0",
    b"Content-Length: -1",
    b"Content-Length: 99999999999",
    b"Content-Length: 1, 2",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip, chunked",
    b"Transfer-Encoding: identity",
    b"Connection: close",
    b"Connection: keep-alive, Upgrade",
    b"Upgrade: websocket",
    b"Expect: 100-continue",
    b"Expect: nonsense",
    b"X-Request-Id: " + b"r" * 200,
    b"X-Request-Id: ok-id",
    b"X-Request-Timeout-Ms: 0.001",
    b"X-Request-Timeout-Ms: nan",
    b"Host: " + b"h" * 9000,
    b"X-Empty:",
    b": no-name",
]
METHODS = ["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE", "G\x00T", "P"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
json_bodies = st.one_of(
    json_values.map(json.dumps),
    st.fixed_dictionaries({"text": json_values}).map(json.dumps),
    st.fixed_dictionaries({"texts": st.lists(json_values, max_size=6)}).map(json.dumps),
    st.fixed_dictionaries({"text": st.text(max_size=60)}).map(json.dumps),
)


def mutate(data: bytes, draw: Any) -> bytes:
    kind = draw(
        st.sampled_from(
            ["flip", "set", "truncate", "insert", "delete", "dup-line", "header", "method",
             "path", "body"]
        )
    )  # fmt: skip
    n = len(data)
    i = draw(st.integers(0, max(0, n - 1)))
    if kind == "flip" and n:
        return data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1 :]
    if kind == "set" and n:
        return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    if kind == "truncate":
        return data[:i]
    if kind == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=40)) + data[i:]
    if kind == "delete":
        return data[:i] + data[i + draw(st.integers(1, 40)) :]
    head, sep, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if kind == "dup-line" and len(lines) > 1:
        k = draw(st.integers(1, len(lines) - 1))
        lines.insert(k, lines[k])
    elif kind == "header":
        lines.insert(draw(st.integers(1, len(lines))), draw(st.sampled_from(NASTY_HEADERS)))
    elif kind == "method":
        lines[0] = draw(st.sampled_from(METHODS)).encode() + b" " + lines[0].partition(b" ")[2]
    elif kind == "path":
        path = draw(st.text(min_size=1, max_size=60)).encode("utf-8", "surrogatepass")
        parts = lines[0].split(b" ")
        lines[0] = b" ".join([parts[0], path, *parts[2:]])
    elif kind == "body":
        body = draw(json_bodies).encode()
        lines = [x for x in lines if not x.lower().startswith(b"content-length")]
        lines.append(b"Content-Length: %d" % len(body))
        sep = b"\r\n\r\n"
    return b"\r\n".join(lines) + sep + body


@st.composite
def http_inputs(draw: Any) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return bytes(draw(st.binary(max_size=600)))
    data = draw(st.sampled_from(TEMPLATES))
    for _ in range(draw(st.integers(1, 3))):
        data = mutate(data, draw)
    return data


def check_http_answers(data: bytes, sent: bytes, reset: bool, seen: Counter[int]) -> None:
    """Every answer is complete HTTP/1.1 with an allowed status, an id and a JSON error."""
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            assert reset, f"partial head {data[:200]!r} for {sent[:300]!r}"
            return
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0].startswith("HTTP/1.1 "), (lines[0], sent[:300])
        status = int(lines[0].split(" ")[1])
        seen[status] += 1
        assert status in ALLOWED_HTTP, (status, rest[:200], sent[:300])
        if status == 100:
            data = rest
            continue
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        assert REQUEST_ID.match(headers["x-request-id"]), headers
        length = int(headers["content-length"])
        if len(rest) < length and b"HEAD" in sent:
            return  # a HEAD answer has no body; what follows cannot be told apart
        assert len(rest) >= length or reset, (headers, rest[:200], sent[:300])
        body, data = rest[:length], rest[length:]
        if status >= 400 and len(body) == length:
            doc = json.loads(body)
            assert isinstance(doc, dict) and isinstance(doc.get("error"), str), body


def test_fuzz_http(srv: ServerProc) -> None:
    pids, scores = srv.worker_pids(), reference(srv)
    seen: Counter[int] = Counter()
    sent = [0]

    @FUZZ
    @given(st.lists(http_inputs(), min_size=BATCH, max_size=BATCH + 4))
    def run(batch: list[bytes]) -> None:
        for data in batch:
            answer, reset = exchange(srv.port, data)
            check_http_answers(answer, data, reset, seen)
            sent[0] += 1

    run()
    assert_unharmed(srv, pids, scores)
    print(f"\nfuzz http: {sent[0]} inputs; answers by status {dict(sorted(seen.items()))}")


# -- control socket -------------------------------------------------------------------------------
HARMLESS_CMDS = ["status", "stats", "", "STATUS", "drain ", "reload\x00", "restart", "scale"]


def harmless(doc: dict[str, Any]) -> bool:
    """Never drain, reload, restart a real worker or change the pool size."""
    cmd = doc.get("cmd")
    if cmd in ("drain", "reload"):
        return False
    if cmd == "restart" and isinstance(doc.get("worker"), int) and doc["worker"] in (0, False):
        return False
    n = doc.get("workers")
    return not (cmd == "scale" and isinstance(n, int) and not isinstance(n, bool) and n != 1)


control_docs = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    st.fixed_dictionaries(
        {"cmd": st.sampled_from(HARMLESS_CMDS) | st.text(max_size=12)},
        optional={"worker": json_values, "workers": json_values},
    ),
).filter(harmless)
control_lines = st.one_of(
    control_docs.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" ")),
    json_values.map(lambda v: json.dumps(v).encode()),
)


def read_line(sock: socket.socket, buf: bytearray) -> dict[str, Any]:
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "control socket closed"
        buf += chunk
    end = buf.index(b"\n")
    line = bytes(buf[:end])
    del buf[: end + 1]
    doc = json.loads(line)
    assert isinstance(doc, dict) and isinstance(doc.get("ok"), bool), doc
    if not doc["ok"]:
        assert isinstance(doc.get("error"), str), doc
    return doc


def test_fuzz_control(srv: ServerProc) -> None:
    pids, scores = srv.worker_pids(), reference(srv)
    count = [0]

    @FUZZ
    @given(st.lists(control_lines, min_size=BATCH, max_size=BATCH + 4))
    def run(lines: list[bytes]) -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(15)
            s.connect(srv.control)
            buf = bytearray()
            for line in lines:
                s.sendall(line + b"\n")
                read_line(s, buf)
                count[0] += 1
            s.sendall(b'{"cmd": "status"}\n')
            assert read_line(s, buf)["ok"] is True  # still usable after all that

    run()
    assert_unharmed(srv, pids, scores)
    assert srv.ready_workers() == 1 and not srv.status()["draining"]
    print(f"\nfuzz control: {count[0]} lines")


# -- binary protocol ------------------------------------------------------------------------------
@st.composite
def frame_streams(draw: Any) -> tuple[bytes, int]:
    """(bytes, frames built): 8 to 12 frames, then in three streams of four one mutation."""
    out = b""
    n = draw(st.integers(BATCH, BATCH + 4))
    for k in range(n):
        tag = (draw(st.integers(0, 2**40)) << 16) | k  # unique unless a mutation copies one
        kind = draw(st.integers(0, 9))
        if kind < 3:  # mostly valid text: served by the worker, the slow part of a run
            text = draw(st.text(min_size=0, max_size=24)).encode("utf-8", "surrogatepass")
        elif kind < 8:
            text = draw(st.binary(max_size=24))
        else:
            text = b" " * draw(st.integers(0, 3))
        out += encode_frame(text, tag)
    if draw(st.integers(0, 3)) == 0:
        return out, n
    return mutate_binary(out, draw), n


def expected_answers(data: bytes) -> Counter[tuple[int, str]]:
    """What the contract owes for these bytes: one answer per complete frame, in front of an
    oversize length or a partial frame: (tag, "bad" for invalid or blank text, else "ok")."""
    owed: Counter[tuple[int, str]] = Counter()
    for tag, text in iter_frames(data, MAX_FRAME):
        try:
            good = bool(text.decode("utf-8").strip())
        except UnicodeDecodeError:
            good = False
        owed[(tag, "ok" if good else "bad")] += 1
    return owed


def check_binary_answers(data: bytes, owed: Counter[tuple[int, str]], seen: Counter[int]) -> None:
    """Whole answers, each frame answered once: status 1 for bad text, 0, 2 or 3 for good."""
    got: Counter[tuple[int, str]] = Counter()
    answers, used = parse_answers(data)
    assert used == len(data), f"partial answer {data[used:]!r}"
    pos = 0
    for a in answers:
        reserved = data[pos + 9]  # the byte after the tag and status
        pos += ANSWER.size + 4 * len(a.scores)
        seen[a.status] += 1
        assert a.status in (0, 1, 2, 3) and reserved == 0, (a.status, reserved)
        got[(a.tag, "bad" if a.status == 1 else "ok")] += 1
        if a.status == 0:
            scores = a.scores
            assert len(scores) == 2 and a.label_id < 2 and abs(sum(scores) - 1) < 1e-4, a
        else:
            assert not a.scores and a.label_id == 0, a
    assert got == owed, (got - owed, owed - got)


def test_fuzz_binary(srv: ServerProc) -> None:
    pids, scores = srv.worker_pids(), reference(srv)
    seen: Counter[int] = Counter()
    frames = [0]

    @FUZZ
    @given(frame_streams())
    def run(stream: tuple[bytes, int]) -> None:
        data, built = stream
        answer, reset = exchange(srv.binary_port, data, timeout=60)
        assert not reset  # the server reads all it is sent, so it never closes with a RST
        check_binary_answers(answer, expected_answers(data), seen)
        frames[0] += built

    run()
    assert_unharmed(srv, pids, scores)
    print(f"\nfuzz binary: {frames[0]} frames; answers by status {dict(sorted(seen.items()))}")
