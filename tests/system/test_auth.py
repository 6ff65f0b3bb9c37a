"""--api-key and --operator-port against real servers: HTTP, KServe through tritonclient, the
binary port, the control socket, probes, the logs, `ps`, and the dashboard on the operator port.

Two servers: one takes its key from RINGSERVE_API_KEY (the documented way) with every log line
on (access log, debug level); the other takes it as --api-key on the command line, which the
server then overwrites in /proc/PID/cmdline, and serves the operator pages on a port of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from ringserve.service.cli import ctl_request
from ringserve.wire.client import AsyncBinaryClient, AuthError, BinaryClient
from ringserve.wire.frames import auth_frame, encode_frame
from tritonclient.utils import InferenceServerException

from devkit.launcher import ROOT, free_port
from devkit.server import ServerProc, serving, wait_for

pytestmark = pytest.mark.timeout(240)

KEY = "rs-test-7f3a9c21e4b8d05a6c"  # not secret: it exists only for these servers
OTHER_KEY = "rs-test-000000000000000000"  # same length, wrong
WRONG_KEYS = [
    OTHER_KEY,
    KEY[:-1],  # a prefix: shorter
    KEY + "0",  # longer, with the right key as prefix
    "x",
    KEY * 8,
]
DENIED = {"error": "missing or invalid API key"}
TEXT = {"text": "a warm and funny film"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    """The key from the environment, every log line on; after all of this module's tests and
    the server's exit, the key must be nowhere in what it wrote."""
    # Every wrong key is answered 401 here: the throttle of failed keys by address (every
    # client here is 127.0.0.1) is off, and tested on its own (test_http_edges.py).
    args = ["--workers", "1", "--spares", "0", "--access-log", "1", "--log-level", "debug",
            "--auth-failures", "0"]  # fmt: skip
    srv = ServerProc(tmp_path_factory.mktemp("keyed"), args, env={"RINGSERVE_API_KEY": KEY})
    with serving(srv):  # ready by the probe: status needs the key
        yield srv
        # Whatever tests ran, the log holds answers to the right key and to a wrong one.
        assert srv.request("GET", "/v1/model", headers=bearer(KEY + "0"))[0] == 401
        assert srv.request("GET", "/v1/model", headers=bearer(KEY))[0] == 200
    log = srv.log_path.read_text(errors="replace")
    assert '"event": "access"' in log and '"status": 401' in log  # it did log those requests
    assert KEY not in log


@pytest.fixture(scope="module")
def model(keyed: ServerProc) -> str:
    status, _, body = keyed.request("GET", "/v1/model", headers=bearer(KEY))
    assert status == 200, body
    name: str = json.loads(body)["name"]
    return name


def assert_denied(srv: ServerProc, method: str, path: str, headers: dict[str, str]) -> None:
    body = TEXT if method == "POST" else None
    status, head, data = srv.request(method, path, body, headers=headers)
    assert status == 401, (path, headers, status, data)
    assert head["www-authenticate"].startswith("Bearer"), head
    assert json.loads(data) == DENIED
    assert KEY not in data.decode()


# -- HTTP ---------------------------------------------------------------------------------------
def test_probes_need_no_key(keyed: ServerProc, model: str) -> None:
    for path in (
        "/v2/health/live",
        "/v2/health/ready",
        f"/v2/models/{model}/ready",
        f"/v2/models/{model}/versions/1/ready",
    ):
        status, _, data = keyed.request("GET", path)
        assert status == 200, (path, data)


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/v1/classify"),
        ("POST", "/v2/models/{model}/infer"),
        ("GET", "/v1/model"),
        ("GET", "/v2"),
        ("GET", "/v2/models/{model}"),
        ("GET", "/metrics"),
        ("GET", "/v1/stats"),
        ("GET", "/no/such/path"),
    ],
)
def test_refused_without_the_right_key(
    keyed: ServerProc, model: str, method: str, path: str
) -> None:
    path = path.format(model=model)
    assert_denied(keyed, method, path, {})
    for wrong in WRONG_KEYS:
        assert_denied(keyed, method, path, bearer(wrong))
    assert_denied(keyed, method, path, {"Authorization": f"Basic {KEY}"})  # the wrong scheme
    assert_denied(keyed, method, path, {"Authorization": KEY})  # no scheme
    assert_denied(keyed, method, path, {"X-Api-Key": KEY})  # not how the key is given


def test_served_with_the_key(keyed: ServerProc, model: str) -> None:
    got = keyed.classify("a warm and funny film", headers=bearer(KEY))
    assert got["label"] in ("positive", "negative") and len(got["scores"]) == 2
    status, _, _ = keyed.request("POST", "/v1/classify", TEXT, {"Authorization": f"bearer {KEY}"})
    assert status == 200  # the scheme's name is case-insensitive
    for path in ("/v1/model", "/v2", f"/v2/models/{model}", "/metrics", "/v1/stats"):
        status, _, data = keyed.request("GET", path, headers=bearer(KEY))
        assert status == 200, (path, data)
        assert KEY not in data.decode()
    status, _, _ = keyed.request("GET", "/no/such/path", headers=bearer(KEY))
    assert status == 404


def test_tritonclient(keyed: ServerProc, model: str) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{keyed.port}", network_timeout=120)
    try:
        assert client.is_server_live() and client.is_server_ready()  # probes: no key
        texts = np.array([b"a gripping film", b"dull and flat"], dtype=np.object_)
        inp = httpclient.InferInput("text", [2], "BYTES")
        inp.set_data_from_numpy(texts, binary_data=True)
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, [inp])
        assert refused.value.status() == "401" or "401" in str(refused.value)
        with pytest.raises(InferenceServerException):
            client.infer(model, [inp], headers=bearer(OTHER_KEY))
        result = client.infer(model, [inp], headers=bearer(KEY))
        scores = result.as_numpy("scores")
        assert scores is not None and scores.shape == (2, 2)
        assert client.get_model_metadata(model, headers=bearer(KEY))["name"] == model
    finally:
        client.close()


# -- binary port --------------------------------------------------------------------------------
def read_until_closed(sock: socket.socket, timeout: float = 30.0) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def binary_ok_count(srv: ServerProc) -> float:
    status, _, body = srv.request("GET", "/metrics", headers=bearer(KEY))
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith('ringserve_requests_total{protocol="binary",code="200"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize(
    "first",
    [
        encode_frame("a warm and funny film", 1),  # no AUTH at all
        auth_frame(OTHER_KEY),
        auth_frame(KEY[:-1]),
        auth_frame(KEY + "0"),
        encode_frame("AUTH " + KEY, 7),  # the right key, but not tag 0
        encode_frame("AUTH", 0),
        b"\xff\xff\xff\x7f",  # a length no AUTH frame has
    ],
    ids=["no-auth", "wrong-key", "shorter-key", "longer-key", "tag-7", "no-key", "huge-length"],
)
def test_binary_closes_without_auth(keyed: ServerProc, first: bytes) -> None:
    """The connection closes, nothing after the first frame is read: the valid frames sent
    behind it get no answer and are never served."""
    before = binary_ok_count(keyed)
    with socket.create_connection(("127.0.0.1", keyed.binary_port), timeout=30) as sock:
        then = b"".join(encode_frame("a gripping film", t) for t in range(2, 6))
        try:
            sock.sendall(first + then)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert read_until_closed(sock) == b""
    assert binary_ok_count(keyed) == before


def test_binary_served_after_auth(keyed: ServerProc, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_connection(("127.0.0.1", keyed.binary_port), timeout=60) as sock:
        sock.sendall(auth_frame(KEY) + encode_frame("a warm and funny film", 9))
        sock.settimeout(60)
        data = b""
        while len(data) < 14 + 14 + 8:  # two answer heads (14 bytes) and two scores
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            data += chunk
        assert data[:14] == bytes(14)  # tag 0, status 0, no scores
        assert int.from_bytes(data[14:22], "little") == 9 and data[22] == 0
    with BinaryClient("127.0.0.1", keyed.binary_port, api_key=KEY) as client:
        answers = client.classify_many(["a gripping film", "dull and flat"])
        assert [a.ok for a in answers] == [True, True]
    monkeypatch.setenv("RINGSERVE_API_KEY", KEY)
    with BinaryClient("127.0.0.1", keyed.binary_port) as client:  # the key from the environment
        assert client.classify("a gripping film").ok
    monkeypatch.setenv("RINGSERVE_API_KEY", OTHER_KEY)
    with pytest.raises(AuthError):
        BinaryClient("127.0.0.1", keyed.binary_port)
    monkeypatch.delenv("RINGSERVE_API_KEY")
    with (
        pytest.raises(ConnectionError),  # no AUTH frame: the server hangs up
        BinaryClient("127.0.0.1", keyed.binary_port, timeout=30) as client,
    ):
        client.classify("a gripping film")

    async def run() -> None:
        client = await AsyncBinaryClient.connect("127.0.0.1", keyed.binary_port, api_key=KEY)
        async with client:
            assert all(a.ok for a in await client.classify_many(["a", "b", "c"]))
        with pytest.raises(AuthError):
            await AsyncBinaryClient.connect("127.0.0.1", keyed.binary_port, api_key=KEY[:-1])

    asyncio.run(run())


# -- control socket, counting, and where the key must not be ------------------------------------
def test_control_socket_and_ctl(keyed: ServerProc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RINGSERVE_API_KEY", raising=False)
    assert ctl_request(keyed.control, {"cmd": "status"}) == {"ok": False, **DENIED}
    assert ctl_request(keyed.control, {"cmd": "status", "key": KEY[:-1]})["ok"] is False
    assert ctl_request(keyed.control, {"cmd": "status", "key": KEY})["ok"] is True
    monkeypatch.setenv("RINGSERVE_API_KEY", KEY)
    assert keyed.status()["ok"] is True  # ctl_request takes the key from the environment
    cli = [
        sys.executable,
        "-m",
        "ringserve.service.cli",
        "ctl",
        "--control",
        keyed.control,
        "status",
    ]
    env = {**os.environ, "RINGSERVE_API_KEY": KEY}
    done = subprocess.run(cli, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"] is True
    env["RINGSERVE_API_KEY"] = OTHER_KEY
    done = subprocess.run(cli, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and KEY not in done.stdout + done.stderr


def test_failures_counted(keyed: ServerProc, model: str) -> None:
    def counts() -> dict[str, float]:
        status, _, body = keyed.request("GET", "/metrics", headers=bearer(KEY))
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if line.startswith("ringserve_auth_failures_total{"):
                out[line.split('"')[1]] = float(line.split()[-1])
            elif line.startswith("ringserve_requests_total{") and 'code="401"' in line:
                out["401 " + line.split('"')[1]] = float(line.split()[-1])
        return out

    before = counts()
    keyed.request("POST", "/v1/classify", TEXT)
    keyed.request("POST", f"/v2/models/{model}/infer", TEXT, bearer(OTHER_KEY))
    with socket.create_connection(("127.0.0.1", keyed.binary_port), timeout=30) as sock:
        sock.sendall(auth_frame(OTHER_KEY))
        read_until_closed(sock)
    ctl_request(keyed.control, {"cmd": "status", "key": OTHER_KEY})
    after = wait_for(
        lambda: (c := counts()).get("binary", 0) > before.get("binary", 0) and c, 10, "counts"
    )
    for protocol in ("http", "kserve", "binary", "control"):
        assert after[protocol] == before.get(protocol, 0) + 1, (protocol, before, after)
    for protocol in ("http", "kserve", "binary"):  # and each is a 401 in requests_total
        key = "401 " + protocol
        assert after[key] == before.get(key, 0) + 1, (protocol, before, after)


def test_key_out_of_children_and_stats(keyed: ServerProc) -> None:
    """The workers never see the key: the server takes it out of the environment they inherit,
    overwrites it in its own /proc/PID/environ, and /v1/stats and the command lines hold no
    trace of it."""
    status, _, body = keyed.request("GET", "/v1/stats", headers=bearer(KEY))
    assert status == 200 and KEY not in body.decode()
    kids = keyed.children()
    assert kids
    front = psutil.Process(keyed.pid)
    assert front.environ().get("RINGSERVE_API_KEY") == "*" * len(KEY)  # /proc/PID/environ
    for proc in [front, *kids]:
        assert KEY not in " ".join(proc.cmdline())
        assert KEY not in json.dumps(proc.environ())
    for kid in kids:
        assert "RINGSERVE_API_KEY" not in kid.environ()


# -- a key on the command line, and the operator port -------------------------------------------
@pytest.fixture(scope="module")
def operated(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    srv = ServerProc(
        tmp_path_factory.mktemp("operated"),
        # The fuzzer sends every request without the key too, hundreds from one address: the
        # throttle of failed keys (429) is off, so that each is the documented 401.
        ["--workers", "1", "--spares", "0", "--access-log", "1", "--api-key", KEY,
         "--operator-port", str(free_port()), "--auth-failures", "0"],
    )  # fmt: skip
    srv.operator_port = int(srv.args[srv.args.index("--operator-port") + 1])
    with serving(srv):  # ready by the probe: status needs the key
        yield srv
    assert KEY not in srv.log_path.read_text(errors="replace")


def operator_request(srv: ServerProc, path: str) -> tuple[int, bytes]:
    import http.client

    port: int = srv.operator_port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_key_hidden_from_ps(operated: ServerProc) -> None:
    cmdline = Path(f"/proc/{operated.pid}/cmdline").read_bytes()
    assert b"--api-key" in cmdline and KEY.encode() not in cmdline
    ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(operated.pid)], capture_output=True)
    assert b"--api-key" in ps.stdout and KEY.encode() not in ps.stdout
    assert operated.classify("a warm and funny film", headers=bearer(KEY))["label"]


def test_operator_pages_move(operated: ServerProc) -> None:
    for path in ("/metrics", "/v1/stats", "/dashboard", "/docs"):
        status, _, _ = operated.request("GET", path, headers=bearer(KEY))
        assert status == 404, path  # gone from the inference port
        assert operated.request("GET", path)[0] == 401  # which says nothing without the key
        status, body = operator_request(operated, path)
        assert status == 200, (path, body[:200])
        assert KEY.encode() not in body
    status, body = operator_request(operated, "/metrics")
    assert b"ringserve_requests_total" in body
    assert operator_request(operated, "/v1/classify")[0] == 404  # no inference there


def test_dashboard_on_operator_port(operated: ServerProc, tmp_path: Path) -> None:
    try:
        from devkit.browser import CHROMIUM, Browser, card_field
    except ImportError:  # pragma: no cover
        pytest.skip("tests.test_dashboard is not importable")
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (python tests/install_browser.py, as root)")
    browser = Browser(tmp_path / "chromium-profile")
    try:
        browser.open(f"http://127.0.0.1:{operated.operator_port}/dashboard")
        workers = operated.ctl({"cmd": "status", "key": KEY})["workers"]
        serving = next(w for w in workers if w["id"] == 0)
        cards = "document.querySelectorAll('#workers .card').length"
        wait_for(lambda: browser.eval(cards) == len(workers), 30, "one card per worker")
        wait_for(lambda: card_field(browser, "pid") == str(serving["pid"]), 15, "worker 0's pid")
        rate = "Number(document.getElementById('rps').textContent) || 0"
        deadline = time.monotonic() + 60
        while browser.eval(rate) <= 0:  # keyed requests on the inference port show up there
            assert time.monotonic() < deadline, "no request rate on the page"
            operated.classify("a warm and funny film", headers=bearer(KEY))
        assert not browser.errors, browser.errors
    finally:
        browser.close()


def test_openapi_document_names_the_key_and_the_ports(operated: ServerProc) -> None:
    """With a key, /openapi.json needs it and documents it (401 and the bearer scheme on every
    route but the probes); with --operator-port each port documents only its own routes."""
    from openapi_spec_validator import validate

    assert operated.request("GET", "/openapi.json")[0] == 401
    status, _, body = operated.request("GET", "/openapi.json", headers=bearer(KEY))
    doc = json.loads(body)
    validate(doc)
    assert status == 200 and doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    classify = doc["paths"]["/v1/classify"]["post"]
    assert "401" in classify["responses"] and classify["security"] == [{"bearer": []}]
    for probe in ("/v2/health/live", "/v2/health/ready", "/v2/models/{model}/ready"):
        op = doc["paths"][probe]["get"]
        assert "401" not in op["responses"] and "security" not in op, probe
    assert not {"/metrics", "/v1/stats", "/dashboard"} & set(doc["paths"])
    status, body = operator_request(operated, "/openapi.json")
    ops = json.loads(body)
    validate(ops)
    docs = {"/docs", "/docs/openapi.json", "/docs/swagger-ui.css", "/docs/swagger-ui-bundle.js"}
    assert set(ops["paths"]) == {"/metrics", "/v1/stats", "/dashboard", "/openapi.json", *docs}
    # /docs there shows the HTTP port's document, its key scheme included
    status, body = operator_request(operated, "/docs/openapi.json")
    assert status == 200 and json.loads(body)["paths"].keys() == doc["paths"].keys()
    assert "bearer" in json.loads(body)["components"]["securitySchemes"]
    # the operator port has no key: no scheme there (its components are its answers' Structs)
    assert "securitySchemes" not in ops.get("components", {})
    assert "Stats" in ops["components"]["schemas"]  # /v1/stats' answer, generated
    assert "401" not in ops["paths"]["/metrics"]["get"]["responses"]


def test_schemathesis_with_the_key(operated: ServerProc, tmp_path: Path) -> None:
    """The fuzzer from the keyed document, with the key: its ignored_auth check also sends each
    request without it (and with a wrong one) and wants the documented 401."""
    from devkit.openapi_checks import fuzz, summary

    docs = f"http://127.0.0.1:{operated.port}/openapi.json"
    run = fuzz(docs, 5, tmp_path, "-H", f"Authorization: Bearer {KEY}", "--phases",
               "examples,coverage,fuzzing")  # fmt: skip
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
    assert " passed" in summary(run) and KEY not in operated.logs()
