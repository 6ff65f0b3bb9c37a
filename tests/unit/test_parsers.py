"""The protocol parsers fed each message whole, one byte at a time and in random chunks.

A real server reads from raw sockets; however the bytes are cut, the answers must be the same.
"""

from __future__ import annotations

import itertools
import json
import math
import socket
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ringserve.wire.frames import LENGTH, AnswerParser, encode_frame

from devkit.server import ServerProc

pytestmark = pytest.mark.timeout(180)
CHUNKED = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- sending and reading ------------------------------------------------------------------------
def pieces(data: bytes, cuts: list[int] | str) -> list[bytes]:
    """`data` cut at the given offsets, or "whole", or "bytes" (one byte a piece)."""
    if isinstance(cuts, str):
        return [data] if cuts == "whole" else [data[i : i + 1] for i in range(len(data))]
    points = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


def open_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each piece its own segment
    return sock


def read_http(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """`count` HTTP/1.1 answers with Content-Length bodies."""
    buf = b""
    out: list[tuple[int, dict[str, str], bytes]] = []
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(out)} of {count} answers"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        length = int(headers["content-length"])
        while len(buf) < length:
            chunk = sock.recv(65536)
            assert chunk, "closed inside a body"
            buf += chunk
        out.append((status, headers, buf[:length]))
        buf = buf[length:]
    return out


def same(a: Any, b: Any) -> bool:
    """Equal, with floats within 1e-5 (the same text gives the same scores in any batch)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, abs_tol=1e-5)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


# -- HTTP -----------------------------------------------------------------------------------------
def http_request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    if body and "Transfer_Encoding" not in headers:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def http_messages(model: str) -> list[tuple[str, bytes, int]]:
    """(name, bytes, answers expected) for each message."""
    one = json.dumps({"text": "a thoroughly enjoyable caf\u00e9 film"}).encode()
    many = json.dumps({"texts": ["dreadful", "  a delight  ", "so-so"]}).encode()
    spec: dict[str, Any] = {"name": "text", "datatype": "BYTES", "shape": [1]}
    spec["parameters"] = {"binary_data_size": 12}
    outputs = [{"name": "scores"}, {"name": "label"}]
    head = json.dumps({"inputs": [spec], "outputs": outputs}).encode()
    blob = struct.pack("<I", 8) + b"gorgeous"
    return [
        ("get", http_request("GET", "/v1/model"), 1),
        ("post one", http_request("POST", "/v1/classify", one), 1),
        ("post many", http_request("POST", "/v1/classify", many), 1),
        (
            "pipelined pair",
            http_request("GET", "/v1/model") + http_request("POST", "/v1/classify", one),
            2,
        ),
        (
            "chunked body",
            http_request("POST", "/v1/classify", chunked(many, 7), Transfer_Encoding="chunked"),
            1,
        ),
        (
            "kserve binary",
            http_request(
                "POST",
                f"/v2/models/{model}/infer",
                head + blob,
                Inference_Header_Content_Length=str(len(head)),
            ),
            1,
        ),
        ("malformed json", http_request("POST", "/v1/classify", b'{"text": '), 1),
    ]


def exchange_http(port: int, data: bytes, cuts: list[int] | str, count: int) -> list[Any]:
    with open_socket(port) as sock:
        for piece in pieces(data, cuts):
            sock.sendall(piece)
        answers = read_http(sock, count)
    return [(status, json.loads(body)) for status, _, body in answers]


@pytest.fixture(scope="module")
def http_reference(server: ServerProc) -> dict[str, tuple[bytes, int, list[Any]]]:
    name = json.loads(server.request("GET", "/v1/model")[2])["name"]
    ref = {}
    for label, data, count in http_messages(name):
        ref[label] = (data, count, exchange_http(server.port, data, "whole", count))
    return ref


def test_http_reference_answers(http_reference: dict[str, tuple[bytes, int, list[Any]]]) -> None:
    statuses = {k: [s for s, _ in v[2]] for k, v in http_reference.items()}
    assert statuses["pipelined pair"] == [200, 200]
    assert statuses["malformed json"] == [400]
    assert all(
        s == [200] for k, s in statuses.items() if k not in ("pipelined pair", "malformed json")
    )


def test_http_one_byte_at_a_time(
    server: ServerProc, http_reference: dict[str, tuple[bytes, int, list[Any]]]
) -> None:
    for label, (data, count, want) in http_reference.items():
        assert same(exchange_http(server.port, data, "bytes", count), want), label


@CHUNKED
@given(data=st.data())
def test_http_random_chunks(
    server: ServerProc, http_reference: dict[str, tuple[bytes, int, list[Any]]], data: Any
) -> None:
    # Every message back to back on one connection, cut anywhere: one pipelined stream.
    stream = b"".join(v[0] for v in http_reference.values())
    want = [a for v in http_reference.values() for a in v[2]]
    cuts = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=40))
    assert same(exchange_http(server.port, stream, cuts, len(want)), want)


# -- binary frames --------------------------------------------------------------------------------
BINARY_TEXTS: list[str | bytes] = [
    "an absorbing drama",
    "",
    "flat, lifeless and far too long",
    b"\xc3\x28 invalid",
    "   ",
    "\u00e9l\u00e9gant et dr\u00f4le",
    "x" * 600,
]
OVERSIZE = LENGTH.pack(65537)


def binary_stream() -> bytes:
    """Frames (good and bad), then an oversize length that ends the connection."""
    frames = b"".join(encode_frame(t, 7 + 100 * i) for i, t in enumerate(BINARY_TEXTS))
    return frames + OVERSIZE


def exchange_binary(port: int, cuts: list[int] | str) -> dict[int, tuple[int, int, list[float]]]:
    with open_socket(port) as sock:
        for piece in pieces(binary_stream(), cuts):
            sock.sendall(piece)
        parser = AnswerParser()
        answers = []
        while chunk := sock.recv(65536):  # the oversize length closes the connection
            answers += parser.feed(chunk)
    got = {a.tag: (a.status, a.label_id, a.scores) for a in answers}
    assert len(got) == len(answers) == len(BINARY_TEXTS), "each frame answered exactly once"
    return got


@pytest.fixture(scope="module")
def binary_reference(server: ServerProc) -> dict[int, tuple[int, int, list[float]]]:
    ref = exchange_binary(server.binary_port, "whole")
    assert [ref[7 + 100 * i][0] for i in range(len(BINARY_TEXTS))] == [0, 1, 0, 1, 1, 0, 0]
    return ref


def test_binary_one_byte_at_a_time(
    server: ServerProc, binary_reference: dict[int, tuple[int, int, list[float]]]
) -> None:
    assert same(exchange_binary(server.binary_port, "bytes"), binary_reference)


@CHUNKED
@given(data=st.data())
def test_binary_random_chunks(
    server: ServerProc, binary_reference: dict[int, tuple[int, int, list[float]]], data: Any
) -> None:
    size = len(binary_stream())
    cuts = data.draw(st.lists(st.integers(1, size - 1), max_size=40))
    assert same(exchange_binary(server.binary_port, cuts), binary_reference)
