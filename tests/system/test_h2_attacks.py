"""The gRPC port's HTTP/2 from outside, against one real server: each flood of issue 46 driven
from raw frames (devkit/h2flood.py) on one connection (for at most two seconds: the server ends
it well before) while a normal client classifies over HTTP and over gRPC (tritonclient) the
whole module; the `h2` library as a plain gRPC client; the RFC
9113 connection errors h2spec checks, each on a connection of its own; and h2load (nghttp2's
load generator, from tests/install_browser.py) driving ModelInfer.

How fast the normal client is answered during a flood is benchmarks/h2_attacks.py's to measure;
here it must be answered, with no failure, while every attacking connection is closed."""

from __future__ import annotations

import json
import re
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
from tritonclient.grpc import service_pb2

from devkit import h2flood
from devkit.h2flood import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PADDED,
    PING,
    PUSH_PROMISE,
    SETTINGS,
    WINDOW_UPDATE,
    call_block,
    connection_error,
    frame,
)
from devkit.load import GrpcLoad, Load
from devkit.server import ServerProc, serving

PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 1, 3, 5, 6
ENHANCE_YOUR_CALM = 11
TEXTS = ["a gripping, beautifully acted film", "dull and far too long", "it was fine"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    with serving(
        ServerProc(tmp_path_factory.mktemp("h2"), ["--workers", "1", "--spares", "0"], grpc=True)
    ) as server:
        yield server


@pytest.fixture(scope="module")
def model(srv: ServerProc) -> str:
    status, _, body = srv.request("GET", "/v1/model")
    assert status == 200, body
    name: str = json.loads(body)["name"]
    return name


@pytest.fixture(scope="module")
def infer_body(model: str) -> bytes:
    return h2flood.model_infer_body(model, TEXTS[0])


@pytest.fixture(scope="module")
def normal(srv: ServerProc, model: str) -> Iterator[tuple[Load, GrpcLoad]]:
    """A client classifying over HTTP, and one over gRPC, for the whole module."""
    with Load(srv.port, TEXTS, clients=1) as http, GrpcLoad(srv.grpc_port, model, TEXTS, 1) as grpc:
        http.wait_ok(3)
        grpc.wait_ok(3)
        yield http, grpc
    assert http.failed() == 0 and grpc.failed() == 0, (http.errors[:5], grpc.errors[:5])


@pytest.mark.parametrize("kind", h2flood.ATTACKS)
def test_a_flood_is_calmed_and_others_are_answered(
    srv: ServerProc, normal: tuple[Load, GrpcLoad], infer_body: bytes, kind: str
) -> None:
    http, grpc = normal
    before = http.ok(), grpc.ok()
    attack = h2flood.Attack(srv.grpc_port, kind, infer_body, duration=2.0).run()
    got = [(c.frames, c.closed, c.goaway, c.debug) for c in attack.connections]
    assert attack.connections and attack.closed_all(), got
    if kind not in ("ping", "settings"):  # those never read: the GOAWAY may be lost with them
        assert all(c.goaway == ENHANCE_YOUR_CALM for c in attack.connections), got
    http.wait_ok(1, timeout=10)
    grpc.wait_ok(1, timeout=10)
    assert http.ok() > before[0] and grpc.ok() > before[1]
    assert http.failed() == 0 and grpc.failed() == 0, (http.errors[:5], grpc.errors[:5])


def test_the_h2_library_as_a_grpc_client(srv: ServerProc, infer_body: bytes) -> None:
    """A unary ModelInfer from an HTTP/2 client other than grpcio: headers, one message, and
    the answer's message and trailers read back."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=30)
    fields = [(":method", "POST"), (":scheme", "http"), (":authority", "localhost"),
              (":path", h2flood.MODEL_INFER), ("content-type", "application/grpc"),
              ("te", "trailers")]  # fmt: skip
    conn.send_headers(1, fields)
    conn.send_data(1, h2flood.grpc_message(infer_body), end_stream=True)
    sock.sendall(conn.data_to_send())
    body, trailers, ended = bytearray(), {}, False
    while not ended:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                body += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, 1)
            elif isinstance(event, h2.events.TrailersReceived):
                trailers = {bytes(k): bytes(v) for k, v in event.headers}
            elif isinstance(event, h2.events.StreamEnded):
                ended = True
        sock.sendall(conn.data_to_send())
    sock.close()
    assert trailers.get(b"grpc-status") == b"0", trailers
    assert body[0] == 0 and int.from_bytes(body[1:5]) == len(body) - 5
    answer = service_pb2.ModelInferResponse.FromString(bytes(body[5:]))
    assert [o.name for o in answer.outputs][:1] and answer.raw_output_contents


UNKNOWN_CALL = call_block("/no.Such/Method")
RFC_CASES = {
    "bad preface": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", PROTOCOL_ERROR),
    "frame over the max size": (frame(0x42, 0, 0, bytes(20000)), FRAME_SIZE_ERROR),
    "HEADERS on an even stream": (frame(HEADERS, END_HEADERS, 2, UNKNOWN_CALL), PROTOCOL_ERROR),
    "DATA on stream 0": (frame(DATA, 0, 0, b"x"), PROTOCOL_ERROR),
    "window overflow": (frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)),
                        FLOW_CONTROL_ERROR),
    "CONTINUATION interrupted": (frame(HEADERS, 0, 1, UNKNOWN_CALL) + frame(PING, 0, 0, bytes(8)),
                                 PROTOCOL_ERROR),
    "CONTINUATION on another stream": (frame(HEADERS, 0, 1, UNKNOWN_CALL)
                                       + frame(CONTINUATION, END_HEADERS, 3), PROTOCOL_ERROR),
    "a decreasing stream id": (frame(HEADERS, END_HEADERS | END_STREAM, 5, UNKNOWN_CALL)
                               + frame(HEADERS, END_HEADERS | END_STREAM, 3, UNKNOWN_CALL),
                               PROTOCOL_ERROR),
    "padding longer than the frame": (frame(HEADERS, END_HEADERS | PADDED, 1, b"\x09abc"),
                                      PROTOCOL_ERROR),
    "SETTINGS not a multiple of 6": (frame(SETTINGS, 0, 0, bytes(5)), FRAME_SIZE_ERROR),
    "PUSH_PROMISE from a client": (frame(PUSH_PROMISE, END_HEADERS, 1, bytes(4)), PROTOCOL_ERROR),
    "DATA on a closed stream": (frame(HEADERS, END_HEADERS | END_STREAM, 1, UNKNOWN_CALL)
                                + frame(DATA, 0, 1, b"late"), STREAM_CLOSED),
}  # fmt: skip


@pytest.mark.parametrize("case", RFC_CASES)
def test_rfc_9113_errors_end_the_connection_only(
    srv: ServerProc, normal: tuple[Load, GrpcLoad], case: str
) -> None:
    data, code = RFC_CASES[case]
    assert connection_error(srv.grpc_port, data, preface=case != "bad preface") == code
    normal[1].wait_ok(1, timeout=10)  # the port still answers its other clients


def test_h2load_drives_model_infer(srv: ServerProc, infer_body: bytes, tmp_path: Path) -> None:
    """nghttp2's h2load, 400 calls over 4 connections of 8 streams each: none errored."""
    h2load = shutil.which("h2load")
    assert h2load, "h2load missing: `make install-test` installs nghttp2-client"
    body = tmp_path / "infer.bin"
    body.write_bytes(h2flood.grpc_message(infer_body))
    url = f"http://127.0.0.1:{srv.grpc_port}{h2flood.MODEL_INFER}"
    before = grpc_counts(srv)
    out = subprocess.run(
        [h2load, "-n", "400", "-c", "4", "-m", "8", "-d", str(body), "-H",
         "content-type: application/grpc", "-H", "te: trailers", url],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    line = next(x for x in out.splitlines() if x.startswith("requests:"))
    assert "400 succeeded, 0 failed, 0 errored, 0 timeout" in line, out
    assert "status codes: 400 2xx" in out, out
    after = grpc_counts(srv)  # h2load sees HTTP's 200; the calls' own statuses are counted here
    assert after.get("200", 0) - before.get("200", 0) >= 400
    assert {c: v for c, v in after.items() if c != "200"} == {
        c: v for c, v in before.items() if c != "200"
    }


def grpc_counts(srv: ServerProc) -> dict[str, float]:
    status, _, body = srv.request("GET", "/metrics")
    assert status == 200
    pattern = r'^ringserve_requests_total\{(?=[^}]*protocol="grpc")[^}]*code="(\d+)"[^}]*\} (\S+)$'
    return {code: float(v) for code, v in re.findall(pattern, body.decode(), re.M)}
