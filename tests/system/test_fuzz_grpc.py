"""Fuzzing the gRPC port of one real server, with test_fuzz.py's hypothesis settings: raw
HTTP/2 byte streams (valid frames, random frames, and mutations of both), and gRPC calls whose
protobuf bytes are random or mutated. The server must answer every call with a status the
contract allows (never INTERNAL or UNKNOWN), close or answer every connection, and afterwards
still give the same scores, hold no client connection, and keep its worker.

RINGSERVE_FUZZ_EXAMPLES counts inputs per test (connections or calls; default 1200); `make
fuzz` runs 100,000 of each.
"""

from __future__ import annotations

import functools
import json
import socket
import struct
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from devkit.fuzz import BATCH, FUZZ, INPUTS, REFERENCE_TEXT, mutate_binary
from devkit.server import ServerProc, serving, wait_for

pytestmark = pytest.mark.timeout(max(300, INPUTS // 25))
SERVICE = "/inference.GRPCInferenceService/"
METHODS = [
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
    "ModelInfer", "ModelInfer", "RepositoryIndex", "ModelConfig", "NoSuchMethod",
]  # fmt: skip
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,  # 400 and 413
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,  # methods not served (ModelConfig), unknown methods
    grpc.StatusCode.UNAVAILABLE,  # 503: a full queue
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # over gRPC's own message limit
}
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Strategies built once: hypothesis caches few of them (not sampled_from), and one built afresh
# at every draw spent most of a long campaign's time on working out its properties again.
PATHS = st.sampled_from([(SERVICE + m).encode() for m in METHODS])
STREAMS = st.sampled_from([1, 3, 5, 0, 2, 2**31 - 1])
HEADER_FLAGS = st.sampled_from([4, 5, 0])
DATA_FLAGS = st.sampled_from([1, 0])
COMPRESSED = st.sampled_from([0, 0, 1, 255])


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    with serving(
        ServerProc(
            tmp_path_factory.mktemp("fuzz-grpc"),
            ["--workers", "1", "--spares", "0", "--max-body", "65536"],
            grpc=True,
        ),
        1,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def model(srv: ServerProc) -> str:
    name: str = json.loads(srv.request("GET", "/v1/model")[2])["name"]
    return name


def grpc_connections(srv: ServerProc) -> int:
    conns = psutil.Process(srv.pid).net_connections("tcp")
    return sum(1 for c in conns if c.laddr and c.laddr.port == srv.grpc_port and c.raddr)


def assert_unharmed(srv: ServerProc, pids: dict[int, int], scores: list[float]) -> None:
    now = wait_for(lambda: srv.classify(REFERENCE_TEXT)["scores"], 30, "a normal answer")
    assert max(abs(a - b) for a, b in zip(now, scores, strict=True)) < 1e-5
    wait_for(lambda: grpc_connections(srv) == 0, 15, "no gRPC client connections left")
    assert srv.worker_pids() == pids and srv.status()["restarts_total"] == 0
    assert "Traceback" not in srv.logs(), srv.logs()[-3000:]


def valid_infer(model: str, texts: list[bytes], raw: bool) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    if raw:
        request.raw_input_contents.append(b"".join(struct.pack("<I", len(t)) + t for t in texts))
    else:
        tensor.contents.bytes_contents.extend(texts)
    return request.SerializeToString()


# -- raw HTTP/2 -----------------------------------------------------------------------------------
def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, no Huffman coding (RFC 7541 6.2.2)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def grpc_headers(path: bytes) -> bytes:
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
              (b":authority", b"fuzz"), (b"content-type", b"application/grpc"),
              (b"te", b"trailers")]  # fmt: skip
    return b"".join(literal(n, v) for n, v in fields)


@functools.cache
def h2_frames(model: str) -> st.SearchStrategy[bytes]:
    return h2_frame(model)


@st.composite
def h2_frame(draw: Any, model: str) -> bytes:
    """One frame: a call's HEADERS or DATA (valid or random payload), or any other frame type
    with random flags, stream and payload."""
    stream = draw(STREAMS)
    kind = draw(st.integers(0, 12))
    if kind < 3:
        return frame(1, draw(HEADER_FLAGS), stream, grpc_headers(draw(PATHS)))
    if kind < 6:
        body = (
            valid_infer(model, [b"a fine film"], draw(st.booleans()))
            if draw(st.booleans())
            else draw(st.binary(max_size=64))
        )
        message = bytes([draw(COMPRESSED)]) + struct.pack(">I", len(body)) + body
        return frame(0, draw(DATA_FLAGS), stream, message)
    kind = draw(st.integers(0, 15))  # PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, ... unknown
    return frame(kind, draw(st.integers(0, 255)), stream, draw(st.binary(max_size=32)))


@st.composite
def h2_streams(draw: Any, model: str) -> bytes:
    out = PREFACE if draw(st.integers(0, 7)) else draw(st.binary(max_size=24))
    out += frame(4, 0, 0, b"")  # SETTINGS
    for _ in range(draw(st.integers(1, 6))):
        out += draw(h2_frames(model))
    return out if draw(st.integers(0, 2)) else mutate_binary(out, draw)


def send_and_close(port: int, data: bytes, timeout: float = 30.0) -> tuple[int, bool]:
    """Send, half-close, read until the server closes: (bytes read, reset seen)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return 0, True
        got = 0
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return got, True
            if not chunk:
                return got, False
            got += len(chunk)


def test_fuzz_grpc_http2(srv: ServerProc, model: str) -> None:
    pids, scores = srv.worker_pids(), srv.classify(REFERENCE_TEXT)["scores"]
    seen: Counter[str] = Counter()

    @FUZZ
    @given(st.lists(h2_streams(model), min_size=BATCH, max_size=BATCH + 4))
    def run(streams: list[bytes]) -> None:
        for data in streams:
            got, reset = send_and_close(srv.grpc_port, data)
            seen["reset" if reset else "closed"] += 1
            seen["answered"] += got > 0

    run()
    assert_unharmed(srv, pids, scores)
    print(f"\nfuzz grpc http2: {seen['closed'] + seen['reset']} connections; {dict(seen)}")


# -- protobuf bytes -------------------------------------------------------------------------------
METHOD_NAMES = st.sampled_from([SERVICE + m for m in METHODS])
TEXT_LISTS = st.lists(st.binary(max_size=16) | st.just(b"a fine film"), min_size=1, max_size=4)


@functools.cache
def model_names(model: str) -> st.SearchStrategy[str]:
    return st.sampled_from([model, model, "", "nope"])


@st.composite
def calls(draw: Any, model: str) -> tuple[str, bytes]:
    method = draw(METHOD_NAMES)
    kind = draw(st.integers(0, 5))
    if kind == 0:
        body = draw(st.binary(max_size=128))
    else:
        body = valid_infer(draw(model_names(model)), draw(TEXT_LISTS), draw(st.booleans()))
        if kind > 2:
            body = mutate_binary(body, draw)
    return method, body


def test_fuzz_grpc_messages(srv: ServerProc, model: str) -> None:
    pids, scores = srv.worker_pids(), srv.classify(REFERENCE_TEXT)["scores"]
    seen: Counter[str] = Counter()
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")

    @FUZZ
    @given(st.lists(calls(model), min_size=BATCH, max_size=BATCH + 4))
    def run(batch: list[tuple[str, bytes]]) -> None:
        futures = [channel.unary_unary(path).future(body, timeout=60) for path, body in batch]
        for future in futures:
            try:
                future.result()
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            seen[code.name] += 1
            assert code in ALLOWED, (code, future.details() if code != grpc.StatusCode.OK else "")

    try:
        run()
    finally:
        channel.close()
    assert_unharmed(srv, pids, scores)
    print(f"\nfuzz grpc messages: {sum(seen.values())} calls; by status {dict(seen)}")
