"""--tls-cert, --tls-key and --tls-client-ca against real servers and the clients people use:
curl, tritonclient (HTTP and gRPC), the openai SDK on httpx, the `h2` library (ALPN h2) and our
binary client, with a CA, a server certificate and a client certificate made here by the openssl
command line (devkit/tls.py).

Two servers: one speaks TLS on every port (HTTP, operator, binary, gRPC), with a short read
timeout and a small connection cap to show both hold for TLS connections; the other requires a
client certificate (mutual TLS). Then a --reuse-port upgrade hands TLS listeners over, and the
start refuses certificates that cannot serve, with exit 2.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from ringserve.wire.client import AsyncBinaryClient, BinaryClient
from ringserve.wire.frames import LENGTH
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from devkit import h2flood
from devkit.launcher import ROOT, free_port, inherited_env
from devkit.server import ServerProc, listening, serving, wait_for
from devkit.tls import Pki, make_pki

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(240)
HOST = "127.0.0.1"
TEXTS = ["a gripping, beautifully acted film", "dull and far too long"]
READ_TIMEOUT_S = 3.0
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_args(pki: Pki, *more: str) -> list[str]:
    return ["--workers", "1", "--spares", "0", "--tls-cert", str(pki.server_cert),
            "--tls-key", str(pki.server_key), *more]  # fmt: skip


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory, default_model: str, pki: Pki
) -> Iterator[ServerProc]:
    args = tls_args(pki, "--operator-port", str(free_port()), "--read-timeout-s",
                    str(READ_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS))  # fmt: skip
    server = ServerProc(tmp_path_factory.mktemp("tls"), args, grpc=True, tls=pki.client_context())
    with serving(server, 1) as ready:
        yield ready


@pytest.fixture(scope="module")
def mtls(
    tmp_path_factory: pytest.TempPathFactory, default_model: str, pki: Pki
) -> Iterator[ServerProc]:
    args = tls_args(pki, "--tls-client-ca", str(pki.ca))
    context = pki.client_context(with_cert=True)
    server = ServerProc(tmp_path_factory.mktemp("mtls"), args, grpc=True, tls=context)
    with serving(server, 1) as ready:
        yield ready


@pytest.fixture(scope="module")
def model(srv: ServerProc) -> str:
    status, _, body = srv.request("GET", "/v1/model")
    assert status == 200, body
    return str(json.loads(body)["name"])


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("curl")
    assert exe is not None, "curl is one of the clients these tests run"
    return subprocess.run([exe, "-sS", "--max-time", "30", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def classify_body() -> str:
    return json.dumps({"texts": TEXTS})


# -- TLS on every port ----------------------------------------------------------------------------
def test_curl(srv: ServerProc, pki: Pki) -> None:
    url = f"https://localhost:{srv.port}/v1/classify"
    done = curl("--cacert", str(pki.ca), url, "-d", classify_body(), "-w", "\n%{http_version}")
    assert done.returncode == 0, done.stderr
    body, version = done.stdout.rsplit("\n", 1)
    assert [r["label"] for r in json.loads(body)["results"]] == ["positive", "negative"]
    assert version == "1.1"  # curl offered h2 too: ALPN chose HTTP/1.1, all the port speaks
    untrusted = curl(url, "-d", classify_body())  # the system's CAs never signed ours
    assert untrusted.returncode == 60, (untrusted.returncode, untrusted.stderr)
    operator = srv.args[srv.args.index("--operator-port") + 1]
    metrics = curl("--cacert", str(pki.ca), f"https://127.0.0.1:{operator}/metrics")
    assert metrics.returncode == 0 and "ringserve_requests_total" in metrics.stdout


def test_plain_clients_fail_cleanly(srv: ServerProc, pki: Pki) -> None:
    """HTTP in the clear to the TLS port is closed at once (not left to the read timeout); so is
    a plain binary client; the server serves on."""
    started = time.monotonic()
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        conn = http.client.HTTPConnection(HOST, srv.port, timeout=30)
        try:
            conn.request("GET", "/v2/health/ready")
            conn.getresponse()
        finally:
            conn.close()
    assert time.monotonic() - started < READ_TIMEOUT_S
    plain = curl(f"http://127.0.0.1:{srv.port}/v2/health/ready")
    assert plain.returncode in (52, 56), (plain.returncode, plain.stderr)  # empty reply, reset
    with pytest.raises(ConnectionError), BinaryClient(HOST, srv.binary_port) as client:
        client.classify(TEXTS[0])
    assert srv.request("GET", "/v2/health/ready")[0] == 200


def test_tritonclient_http(srv: ServerProc, pki: Pki, model: str) -> None:
    client = httpclient.InferenceServerClient(
        f"localhost:{srv.port}", ssl=True, ssl_options={"ca_certs": str(pki.ca)},
        network_timeout=120,
    )  # fmt: skip
    try:
        assert client.is_server_live() and client.is_server_ready()
        inp = httpclient.InferInput("text", [2], "BYTES")
        inp.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_))
        scores = client.infer(model, [inp]).as_numpy("scores")
        assert scores is not None and scores.shape == (2, 2)
        assert scores[0].argmax() == 1 and scores[1].argmax() == 0
    finally:
        client.close()


def grpc_infer(client: grpcclient.InferenceServerClient, model: str) -> np.ndarray:
    inp = grpcclient.InferInput("text", [2], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_))
    scores = client.infer(model, [inp], client_timeout=60).as_numpy("scores")
    assert scores is not None
    return scores


def test_tritonclient_grpc(srv: ServerProc, pki: Pki, model: str) -> None:
    client = grpcclient.InferenceServerClient(
        f"localhost:{srv.grpc_port}", ssl=True, root_certificates=str(pki.ca)
    )
    try:
        assert client.is_server_ready()
        scores = grpc_infer(client, model)
        assert scores.shape == (2, 2) and scores[0].argmax() == 1
    finally:
        client.close()


def test_openai_client(srv: ServerProc, pki: Pki) -> None:
    with httpx.Client(verify=pki.client_context()) as http:
        client = openai.OpenAI(base_url=f"https://localhost:{srv.port}/v1", api_key="unused",
                               max_retries=0, http_client=http)  # fmt: skip
        got = client.embeddings.create(model="m", input=TEXTS)
    assert len(got.data) == 2 and len(got.data[0].embedding) == 384


def h2_call(sock: ssl.SSLSocket, body: bytes) -> tuple[dict[bytes, bytes], bytes]:
    """One unary ModelInfer from the `h2` library: its answer's trailers and message."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    fields = [(":method", "POST"), (":scheme", "https"), (":authority", "localhost"),
              (":path", h2flood.MODEL_INFER), ("content-type", "application/grpc"),
              ("te", "trailers")]  # fmt: skip
    conn.send_headers(1, fields)
    conn.send_data(1, h2flood.grpc_message(body), end_stream=True)
    sock.sendall(conn.data_to_send())
    answer, trailers, ended = bytearray(), {}, False
    while not ended:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                answer += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, 1)
            elif isinstance(event, h2.events.TrailersReceived):
                trailers = {bytes(k): bytes(v) for k, v in event.headers}
            elif isinstance(event, h2.events.StreamEnded):
                ended = True
        sock.sendall(conn.data_to_send())
    return trailers, bytes(answer)


def test_h2_library_over_tls(srv: ServerProc, pki: Pki, model: str) -> None:
    context = pki.client_context()
    context.set_alpn_protocols(["h2"])
    raw = socket.create_connection((HOST, srv.grpc_port), timeout=30)
    with context.wrap_socket(raw, server_hostname="localhost") as sock:
        assert sock.selected_alpn_protocol() == "h2"
        trailers, body = h2_call(sock, h2flood.model_infer_body(model, TEXTS[0]))
    assert trailers.get(b"grpc-status") == b"0", trailers
    answer = service_pb2.ModelInferResponse.FromString(body[5:])
    assert answer.model_name == model and answer.raw_output_contents


def test_binary_client(srv: ServerProc, pki: Pki) -> None:
    """The SDK over TLS: a pipelined batch (many TLS records each way), and the asyncio client."""
    texts = [TEXTS[i % 2] + f" #{i}" for i in range(600)]
    with BinaryClient(HOST, srv.binary_port, ssl=pki.client_context(),
                      server_hostname="localhost") as client:  # fmt: skip
        answers = client.classify_many(texts)
    assert all(a.ok for a in answers) and len(answers) == len(texts)
    assert [a.label_id for a in answers[:2]] == [1, 0]

    async def run() -> list[Any]:
        client = await AsyncBinaryClient.connect(HOST, srv.binary_port, ssl=pki.client_context())
        async with client:
            return await client.classify_many(TEXTS)

    assert [a.label_id for a in asyncio.run(run())] == [1, 0]


def closed_within(port: int, sent: bytes, limit: float) -> float:
    """Connect, send `sent` (nothing, or a handshake's start) and wait for the server to close;
    returns how long that took."""
    started = time.monotonic()
    with socket.create_connection((HOST, port), timeout=limit) as sock:
        if sent:
            sock.sendall(sent)
        try:
            while sock.recv(4096):
                pass
        except ConnectionResetError:
            pass
    return time.monotonic() - started


def test_a_handshake_never_finished_is_closed_after_the_read_timeout(srv: ServerProc) -> None:
    """On every port: a client that opens TCP and sends nothing, or the first bytes of a
    ClientHello, is closed once --read-timeout-s has passed (3 s here)."""
    hello_start = bytes.fromhex("160301020001")  # a record header and a ClientHello's first byte
    operator = int(srv.args[srv.args.index("--operator-port") + 1])
    cases = [(p, sent) for p in (srv.port, srv.binary_port, srv.grpc_port, operator)
             for sent in (b"", hello_start)]  # fmt: skip
    with ThreadPoolExecutor(len(cases)) as pool:
        took = list(pool.map(lambda c: closed_within(*c, READ_TIMEOUT_S + 20), cases))
    assert all(READ_TIMEOUT_S - 0.1 < t < READ_TIMEOUT_S + 10 for t in took), (cases, took)
    assert srv.request("GET", "/v2/health/ready")[0] == 200


def test_a_slow_request_over_tls_meets_the_read_timeout(srv: ServerProc, pki: Pki) -> None:
    """After the handshake the protocol's own limits apply: a head that never ends is answered
    408 (HTTP), a frame that never ends closes the connection (binary), after the read timeout.
    The two wait out their timeouts side by side."""
    context = pki.client_context()

    def slow(port: int, sent: bytes) -> tuple[bytes, float]:
        raw = socket.create_connection((HOST, port), timeout=READ_TIMEOUT_S + 20)
        with context.wrap_socket(raw, server_hostname="localhost") as sock:
            started = time.monotonic()
            sock.sendall(sent)
            answer = read_to_close(sock)
            return answer, time.monotonic() - started

    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\n"
    frame = LENGTH.pack(16) + b"half"  # a 16-byte text, 4 bytes of it sent
    with ThreadPoolExecutor(2) as pool:
        http = pool.submit(slow, srv.port, head)
        binary = pool.submit(slow, srv.binary_port, frame)
        (answer, took), (unanswered, took_binary) = http.result(), binary.result()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert READ_TIMEOUT_S - 0.1 < took < READ_TIMEOUT_S + 10, took
    assert unanswered == b""
    assert READ_TIMEOUT_S - 0.1 < took_binary < READ_TIMEOUT_S + 10, took_binary


def read_to_close(sock: ssl.SSLSocket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, ssl.SSLEOFError):
        pass
    return data


def closed_at_once(port: int) -> bool:
    try:
        return closed_within(port, b"", 0.3) < 0.3
    except TimeoutError:
        return False


def test_handshakes_past_the_cap_are_closed_at_once(srv: ServerProc, pki: Pki) -> None:
    """At most --max-connections connections of a port are in a handshake at once: with that
    many left silent, the next is closed as soon as it is accepted, long before the read
    timeout; once the silent ones time out, TLS clients are served again."""
    for port in (srv.port, srv.grpc_port):
        silent = [
            socket.create_connection((HOST, port), timeout=30) for _ in range(MAX_CONNECTIONS)
        ]
        try:  # the next is closed at once, from when the server has accepted those
            wait_for(lambda: closed_at_once(port), READ_TIMEOUT_S * 0.75, "a connection closed")  # noqa: B023
        finally:
            for sock in silent:
                sock.close()
    wait_for(lambda: srv.request("GET", "/v2/health/ready")[0] == 200, 20, "TLS served again")
    full = [json.loads(x) for x in srv.logs().splitlines() if '"tls_handshakes_full"' in x]
    assert {line["listener"] for line in full} == {"http", "grpc"}, full


def test_the_connection_cap_holds_for_tls(srv: ServerProc, pki: Pki) -> None:
    """--max-connections counts a TLS connection once its handshake is done: past the cap, the
    next is answered 503 over TLS and closed, as in the clear."""
    context = pki.client_context()
    held: list[ssl.SSLSocket] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            raw = socket.create_connection((HOST, srv.port), timeout=30)
            held.append(context.wrap_socket(raw, server_hostname="localhost"))
        wait_for(lambda: open_connections(srv) >= MAX_CONNECTIONS, 10, "the held connections")
        status, _, body = srv.request("GET", "/v2/health/ready")
        assert status == 503 and b"too many connections" in body, (status, body)
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: srv.request("GET", "/v2/health/ready")[0] == 200, 20, "room again")


def open_connections(srv: ServerProc) -> int:
    """The HTTP port's open connections, as the operator port's metrics count them."""
    operator = int(srv.args[srv.args.index("--operator-port") + 1])
    conn = http.client.HTTPSConnection(HOST, operator, timeout=10, context=srv.tls)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    for line in text.splitlines():
        if line.startswith("ringserve_http_connections "):
            return int(float(line.split()[-1]))
    return 0


# -- mutual TLS -----------------------------------------------------------------------------------
def test_mtls_curl(mtls: ServerProc, pki: Pki) -> None:
    url = f"https://localhost:{mtls.port}/v1/classify"
    ca = ["--cacert", str(pki.ca)]
    mine = ["--cert", str(pki.client_cert), "--key", str(pki.client_key)]
    done = curl(*ca, *mine, url, "-d", classify_body())
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["results"]) == 2
    without = curl(*ca, url, "-d", classify_body())
    assert without.returncode != 0 and without.stdout == "", (without.returncode, without.stdout)
    theirs = ["--cert", str(pki.other_client_cert), "--key", str(pki.other_client_key)]
    stranger = curl(*ca, *theirs, url, "-d", classify_body())
    assert stranger.returncode != 0 and stranger.stdout == "", stranger.returncode


def test_mtls_tritonclient_and_openai(mtls: ServerProc, pki: Pki, model: str) -> None:
    """Each client with the client certificate is served; without it, refused."""
    url = f"localhost:{mtls.grpc_port}"
    with_cert = grpcclient.InferenceServerClient(
        url, ssl=True, root_certificates=str(pki.ca), private_key=str(pki.client_key),
        certificate_chain=str(pki.client_cert),
    )  # fmt: skip
    without = grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca))
    try:
        assert grpc_infer(with_cert, model).shape == (2, 2)
        with pytest.raises(InferenceServerException):
            without.is_server_ready(client_timeout=30)
    finally:
        with_cert.close()
        without.close()
    options = {"ca_certs": str(pki.ca), "certfile": str(pki.client_cert),
               "keyfile": str(pki.client_key)}  # fmt: skip
    client = httpclient.InferenceServerClient(f"localhost:{mtls.port}", ssl=True,
                                              ssl_options=options)  # fmt: skip
    try:
        assert client.is_server_ready()
    finally:
        client.close()
    base = f"https://localhost:{mtls.port}/v1"
    with httpx.Client(verify=pki.client_context(with_cert=True)) as http:
        sdk = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, http_client=http)
        assert len(sdk.embeddings.create(model="m", input=TEXTS).data) == 2
    with httpx.Client(verify=pki.client_context()) as http:
        sdk = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, http_client=http)
        with pytest.raises(openai.APIConnectionError):
            sdk.embeddings.create(model="m", input=TEXTS)


def test_mtls_binary(mtls: ServerProc, pki: Pki) -> None:
    with BinaryClient(HOST, mtls.binary_port, ssl=pki.client_context(with_cert=True),
                      server_hostname="localhost") as client:  # fmt: skip
        assert client.classify(TEXTS[0]).ok
    no_cert = pki.client_context()
    with (
        pytest.raises((ConnectionError, ssl.SSLError)),
        BinaryClient(HOST, mtls.binary_port, ssl=no_cert, server_hostname="localhost") as client,
    ):
        client.classify(TEXTS[0])
    assert mtls.request("GET", "/v2/health/ready")[0] == 200


# -- handover and start ---------------------------------------------------------------------------
def handed_over(srv: ServerProc) -> list[str]:
    lines = [json.loads(x) for x in srv.logs().splitlines() if "listener_handed_over" in x]
    return sorted(line["name"] for line in lines)


def test_a_reuse_port_upgrade_hands_over_tls_listeners(
    tmp_path: Path, default_model: str, pki: Pki, model: str
) -> None:
    """The new server serves TLS on the sockets the old one hands over."""
    args = tls_args(pki, "--reuse-port")
    old = ServerProc(tmp_path, args, grpc=True, tls=pki.client_context())
    with serving(old, 1):
        new = ServerProc(tmp_path, args, beside=old, grpc=True, tls=pki.client_context())
        try:
            wait_for(lambda: listening(new), 120, "the new server listening")
            assert handed_over(new) == ["binary", "grpc", "http"]
            old.terminate()
            assert new.request("GET", "/v2/health/ready")[0] == 200
            assert [r["label"] for r in new.classify(TEXTS)["results"]] == ["positive", "negative"]
            client = grpcclient.InferenceServerClient(
                f"localhost:{new.grpc_port}", ssl=True, root_certificates=str(pki.ca)
            )
            try:
                assert grpc_infer(client, model).shape == (2, 2)
            finally:
                client.close()
        finally:
            assert new.stop() == 0


def test_certificates_that_cannot_serve_stop_the_start(tmp_path: Path, pki: Pki) -> None:
    """Exit 2 before anything starts, naming the option and the file: by flag, by RINGSERVE_*
    and by config file alike."""
    (tmp_path / "ringserve.toml").write_text(f'tls_cert = "{pki.server_cert}"\n'
                                             f'tls_key = "{pki.client_key}"\n')  # fmt: skip
    cases = [
        (["--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(pki.server_key)], {},
         "cannot read it"),
        (["--tls-cert", str(pki.server_cert)], {"RINGSERVE_TLS_KEY": str(pki.client_key)},
         "is not the key of --tls-cert"),
        (["--config", str(tmp_path / "ringserve.toml")], {}, "is not the key of --tls-cert"),
        (["--tls-cert", str(pki.server_key), "--tls-key", str(pki.server_key)], {},
         "no PEM CERTIFICATE"),
    ]  # fmt: skip
    clean = {k: v for k, v in inherited_env().items() if not k.startswith("RINGSERVE_")}
    for args, env, said in cases:
        done = subprocess.run(
            [sys.executable, "-m", "ringserve.service.cli", "serve", "--port", str(free_port()),
             "--control", str(tmp_path / "ctl.sock"), *args],
            cwd=ROOT, env={**clean, **env}, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, (args, done.returncode, done.stderr[-2000:])
        assert said in done.stderr, (args, done.stderr[-2000:])
        assert not (tmp_path / "ctl.sock").exists()  # nothing started
