"""--api-keys: tenants, rates, priorities and reloads, against one real keyed server, plus the
key file's parser and the token bucket in-process (on given times).

The full 20 s open-loop rate test (200 req/s offered to a 50 req/s key beside an untouched one)
is benchmarks/tenants.py; here a short bounded burst checks the same rule: a key never gets
more than burst + rate x elapsed answered, the rest get 429 with Retry-After, and another
key's requests all pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from ringserve.service.engine.tenants import (
    BULK,
    INTERACTIVE,
    KeyFileError,
    KeyRing,
    Tenant,
    parse_keys,
)
from ringserve.wire.client import BinaryClient
from ringserve.wire.frames import RATE_LIMITED

from devkit.http import HOST
from devkit.launcher import ROOT, free_port
from devkit.server import ServerProc, serving, wait_for

pytestmark = pytest.mark.timeout(240)

FAST = "rs-tenant-fast-0a1b2c3d4e5f"  # not secrets: they exist only for this server
SLOW = "rs-tenant-slow-9f8e7d6c5b4a"
BULKY = "rs-tenant-bulk-1122334455aa"
NEW = "rs-tenant-new-66778899bbcc"
SINGLE = "rs-tenant-single-ddeeff0011"
SLOW_RATE, SLOW_BURST = 5.0, 4.0
OPERATOR = {"Authorization": f"Bearer {SINGLE}"}  # the unnamed key: its reads count for no tenant
KEYS = f"""# tenants of the test server
{FAST} tenant=alpha
{SLOW} tenant=beta rate={SLOW_RATE:g} burst={SLOW_BURST:g}   # a slow key
{BULKY} tenant=gamma priority=bulk
"""


# -- in-process: the parser and the bucket ------------------------------------------------------
def test_the_key_file_parser() -> None:
    entries = parse_keys(KEYS, "keys")
    tenants = [t for _, t in entries]
    assert [t.name for t in tenants] == ["alpha", "beta", "gamma"]
    assert tenants[0] == Tenant("alpha")  # unlimited, interactive
    assert (tenants[1].rate, tenants[1].burst) == (SLOW_RATE, SLOW_BURST)
    assert tenants[2].priority == BULK and tenants[1].priority == INTERACTIVE
    assert parse_keys("k#1 tenant=a rate=3", "f")[0][1].burst == 3  # burst defaults to the rate


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("good tenant=a\nbad tenant=a rate=fast", "f line 2: rate must be a number"),
        ("k1 tenant=a\n\n# c\nk1 tenant=b", "f line 4: the same key as line 1"),
        ("k1", "f line 1: tenant=NAME is required"),
        ("k1 tenant=a priority=urgent", "f line 1: priority must be interactive or bulk"),
        ("k1 tenant=a burst=3", "f line 1: burst needs a rate"),
        ("k1 tenant=a rate=0", "f line 1: rate must be above 0"),
        ("k1 tenant=a rate=2 burst=0.5", "f line 1: burst must be at least 1"),
        ("k1 tenant=a colour=red", "f line 1: unknown field 'colour'"),
        ("k1 tenant=a tenant=b", "f line 1: tenant given twice"),
        ("k1 tenant=no/slash", "f line 1: tenant must be"),
        ("tenant=a", "f line 1: the first word must be the key"),
    ],
)
def test_a_bad_line_is_named_and_the_key_is_not(text: str, message: str) -> None:
    with pytest.raises(KeyFileError) as err:
        parse_keys(text, "f")
    assert str(err.value).startswith(message)
    assert "k1" not in str(err.value) and "good" not in str(err.value)


def test_the_bucket_on_given_times() -> None:
    t = Tenant("a", rate=10.0, burst=3.0)
    s = 1_000_000_000
    assert t.take(5 * s, 5) == 3  # a full bucket: the burst, then nothing
    assert t.take(5 * s) == 0 and t.retry_after_s() == 1
    assert t.take(5 * s + s // 10) == 1  # a tenth of a second: one more
    assert t.take(6 * s, 20) == 3  # a second later: never more than the burst
    slow = Tenant("b", rate=0.25, burst=1.0)
    assert slow.take(s) == 1 and slow.take(s) == 0
    assert slow.retry_after_s() == 4  # a token every 4 s
    assert Tenant("c").take(s, 1000) == 1000  # no rate: unlimited
    bulk = Tenant("d", priority=BULK)
    assert bulk.priority_for(INTERACTIVE) == BULK and bulk.priority_for(None) == BULK
    assert Tenant("e").priority_for(BULK) == BULK  # lowering is always allowed


def test_a_reload_keeps_a_kept_keys_bucket(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("k1 tenant=a rate=1 burst=1\nk2 tenant=b\n")
    ring = KeyRing(path=str(path))
    first = ring.identify(b"k1")
    assert first is not None and first.take(10**9) == 1
    path.write_text("k1 tenant=a rate=1 burst=1\nk3 tenant=c\n")
    assert ring.reload() is None
    assert ring.identify(b"k1") is first and first.take(10**9) == 0  # not refilled by a reload
    assert ring.identify(b"k2") is None and ring.identify(b"k3") is not None
    path.write_text("k1 tenant=a\nk4 tenant=d rate=-1\n")
    assert ring.reload() == f"{path} line 2: rate must be above 0"
    assert ring.identify(b"k3") is not None and ring.identify(b"k4") is None  # old keys kept


def test_a_bad_key_file_stops_the_start_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{FAST} tenant=alpha\n# fine so far\n{SLOW} tenant=beta rate=many\n")
    port = free_port()
    args = [sys.executable, "-m", "ringserve.service.cli", "serve", "--api-keys", str(path)]
    args += ["--port", str(port), "--binary-port", "0", "--control", str(tmp_path / "c.sock")]
    run = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert f"{path} line 3: rate must be a number" in run.stderr
    assert FAST not in run.stderr + run.stdout and SLOW not in run.stderr + run.stdout
    assert not (tmp_path / "c.sock").exists()


# -- one keyed server ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(KEYS)
    os.chmod(path, 0o600)
    return path


@pytest.fixture(scope="module")
def tenanted(
    tmp_path_factory: pytest.TempPathFactory, default_model: str, keyfile: Path
) -> Iterator[ServerProc]:
    args = ["--workers", "1", "--spares", "0", "--api-keys", str(keyfile)]
    with serving(
        ServerProc(
            tmp_path_factory.mktemp("tenants"), args, env={"RINGSERVE_API_KEY": SINGLE}, grpc=True
        )
    ) as srv:
        yield srv
    log = srv.logs()
    assert all(k not in log for k in (FAST, SLOW, BULKY, NEW, SINGLE))


def call(
    srv: ServerProc, key: str | None, text: str = "fine", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    h = dict(headers)
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    return srv.request("POST", "/v1/classify", {"text": text}, h)


def stats(srv: ServerProc) -> dict[str, dict[str, object]]:
    status, _, body = srv.request("GET", "/v1/stats", headers=OPERATOR)
    assert status == 200
    return {row["tenant"]: row for row in json.loads(body)["tenants"]}


def metric(srv: ServerProc, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    _, _, body = srv.request("GET", "/metrics", headers=OPERATOR)
    total = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_keys_single_and_named_are_accepted_and_others_refused(tenanted: ServerProc) -> None:
    for key in (FAST, SLOW, BULKY, SINGLE):
        assert call(tenanted, key)[0] == 200, key
    for key in (None, "rs-tenant-fast-0a1b2c3d4e5", FAST + "0", "nope"):
        assert call(tenanted, key)[0] == 401, key


async def offer(port: int, key: str, n: int, interval_s: float) -> list[tuple[int, str | None]]:
    """Open loop: n requests, one every interval, each on its own connection, whatever the
    answers do; (status, Retry-After) of each."""

    async def one(delay: float) -> tuple[int, str | None]:
        await asyncio.sleep(delay)
        reader, writer = await asyncio.open_connection(HOST, port)
        body = b'{"text": "an open loop"}'
        writer.write(
            b"POST /v1/classify HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer %s\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (key.encode(), len(body), body)
        )
        raw = await reader.read()
        writer.close()
        head = raw.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        fields = dict(line.lower().split(": ", 1) for line in head[1:])
        return int(head[0].split()[1]), fields.get("retry-after")

    return await asyncio.gather(*(one(i * interval_s) for i in range(n)))


def test_a_key_over_its_rate_gets_429_and_another_key_is_untouched(tenanted: ServerProc) -> None:
    before_429 = metric(tenanted, "ringserve_requests_total", code="429", tenant="beta")
    before_limited = stats(tenanted)["beta"]["limited"]
    alpha_before = stats(tenanted)["alpha"]["ok"]

    async def both() -> tuple[list[tuple[int, str | None]], list[tuple[int, str | None]], float]:
        t0 = time.monotonic()
        slow, fast = await asyncio.gather(
            offer(tenanted.port, SLOW, 40, 0.025),  # 40 req/s for 1 s to a 5 req/s key
            offer(tenanted.port, FAST, 20, 0.05),  # 20 req/s to an unlimited one, meanwhile
        )
        return slow, fast, time.monotonic() - t0

    slow, fast, elapsed = asyncio.run(both())
    ok = sum(1 for s, _ in slow if s == 200)
    limited = [r for s, r in slow if s == 429]
    assert ok + len(limited) == len(slow)
    # The bucket's promise, whatever the machine's speed: at most burst + rate x elapsed.
    assert SLOW_BURST <= ok <= SLOW_BURST + SLOW_RATE * elapsed + 1, (ok, elapsed)
    assert limited and all(r is not None and int(r) >= 1 for r in limited)
    assert [s for s, _ in fast] == [200] * len(fast)  # the other key: untouched
    assert metric(
        tenanted, "ringserve_requests_total", code="429", tenant="beta"
    ) - before_429 == len(limited)
    after = stats(tenanted)
    assert after["beta"]["limited"] == before_limited + len(limited)
    assert after["alpha"]["ok"] == alpha_before + len(fast)  # counted per tenant
    assert metric(tenanted, "ringserve_requests_total", code="429", tenant="alpha") == 0


def test_a_429_says_why_and_when(tenanted: ServerProc) -> None:
    def limited() -> tuple[int, dict[str, str], bytes] | None:
        answer = call(tenanted, SLOW)
        return answer if answer[0] == 429 else None

    _, headers, body = wait_for(limited, 30, "a 429", interval=0.001)
    assert json.loads(body) == {"error": f"over the key's rate of {SLOW_RATE:g} requests/s"}
    assert 1 <= int(headers["retry-after"]) <= 1 / SLOW_RATE + 1
    assert "x-request-id" in headers and "x-latency-ms" in headers


def test_binary_frames_over_the_rate_get_status_6(tenanted: ServerProc) -> None:
    with BinaryClient(HOST, tenanted.binary_port, api_key=SLOW) as client:
        answers = client.classify_many(["frame"] * 30)  # pipelined: far faster than 5/s
    statuses = [a.status for a in answers]
    assert statuses.count(0) <= SLOW_BURST + 1 and RATE_LIMITED in statuses
    assert set(statuses) <= {0, RATE_LIMITED}
    assert all(a.scores == [] for a in answers if a.status == RATE_LIMITED)
    with BinaryClient(HOST, tenanted.binary_port, api_key=FAST) as client:
        assert all(a.ok for a in client.classify_many(["frame"] * 30))


def grpc_infer(srv: ServerProc, key: str | None, text: str = "fine") -> tuple[str, dict[str, str]]:
    """One ModelInfer with tritonclient's own messages: its status code name and trailers."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    _, _, body = srv.request("GET", "/v1/model", headers=OPERATOR)
    req = service_pb2.ModelInferRequest(model_name=json.loads(body)["name"])
    req.inputs.add(name="text", datatype="BYTES", shape=[1])
    req.raw_input_contents.append(len(text).to_bytes(4, "little") + text.encode())
    meta = [("authorization", f"Bearer {key}")] if key is not None else []
    with grpc.insecure_channel(f"{HOST}:{srv.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            _, call = stub.ModelInfer.with_call(req, metadata=meta, timeout=30)
        except grpc.RpcError as exc:
            return exc.code().name, dict(exc.trailing_metadata() or ())
        return call.code().name, dict(call.trailing_metadata() or ())


def test_grpc_calls_name_their_tenant_and_keep_its_rate(tenanted: ServerProc) -> None:
    """gRPC goes through the same keys: a wrong key is UNAUTHENTICATED, a call over the key's
    rate RESOURCE_EXHAUSTED with the wait in its trailers, and both count for the tenant."""
    assert grpc_infer(tenanted, "not-a-key")[0] == "UNAUTHENTICATED"
    assert grpc_infer(tenanted, None)[0] == "UNAUTHENTICATED"
    before = metric(tenanted, "ringserve_requests_total", protocol="grpc", tenant="beta")

    def limited() -> dict[str, str] | None:
        code, trailers = grpc_infer(tenanted, SLOW)
        assert code in ("OK", "RESOURCE_EXHAUSTED"), code
        return trailers if code == "RESOURCE_EXHAUSTED" else None

    trailers = wait_for(limited, 30, "a RESOURCE_EXHAUSTED", interval=0.001)
    assert 1 <= int(trailers["retry-after"]) <= 1 / SLOW_RATE + 1
    assert grpc_infer(tenanted, FAST)[0] == "OK"  # the other key: untouched
    assert metric(tenanted, "ringserve_requests_total", protocol="grpc", tenant="beta") > before
    assert metric(tenanted, "ringserve_requests_total", protocol="grpc", code="429") >= 1
    assert metric(tenanted, "ringserve_requests_total", protocol="grpc", tenant="alpha") >= 1


def test_a_request_may_lower_its_priority_but_never_raise_it(tenanted: ServerProc) -> None:
    rows = stats(tenanted)
    alpha, gamma = rows["alpha"]["bulk_texts"], rows["gamma"]["bulk_texts"]
    assert call(tenanted, FAST, **{"X-Priority": "bulk"})[0] == 200
    assert call(tenanted, BULKY, **{"X-Priority": "interactive"})[0] == 200  # stays bulk
    assert call(tenanted, FAST, **{"X-Priority": "interactive"})[0] == 200
    status, _, body = call(tenanted, FAST, **{"X-Priority": "urgent"})
    assert status == 400 and b"X-Priority" in body
    name = json.loads(
        tenanted.request("GET", "/v1/model", headers={"Authorization": f"Bearer {FAST}"})[2]
    )["name"]
    client = httpclient.InferenceServerClient(f"{HOST}:{tenanted.port}")
    try:
        inp = httpclient.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"kserve, lowered"], dtype=object))
        client.infer(name, [inp], headers={"Authorization": f"Bearer {FAST}"}, priority=2)
        client.infer(name, [inp], headers={"Authorization": f"Bearer {BULKY}"}, priority=1)
    finally:
        client.close()
    rows = stats(tenanted)
    assert rows["alpha"]["bulk_texts"] == alpha + 2  # the header's and KServe's priority 2
    assert rows["gamma"]["bulk_texts"] == gamma + 2  # never raised above the key's
    assert rows["gamma"]["priority"] == ["bulk"] and rows["alpha"]["priority"] == ["interactive"]


def test_a_reload_takes_new_keys_and_a_refused_one_keeps_the_old(
    tenanted: ServerProc, keyfile: Path
) -> None:
    assert call(tenanted, NEW)[0] == 401
    keyfile.write_text(KEYS + f"{NEW} tenant=delta rate=1000\n")
    reply = tenanted.ctl({"cmd": "reload", "key": SINGLE})
    assert reply["ok"], reply
    assert call(tenanted, NEW)[0] == 200  # no restart
    keyfile.write_text(f"{FAST} tenant=alpha\n{NEW} tenant=delta rate=fast\n")
    reply = tenanted.ctl({"cmd": "reload", "key": SINGLE})
    assert not reply["ok"] and f"{keyfile} line 2: rate must be a number" in reply["error"]
    assert NEW not in reply["error"]
    for key in (NEW, SLOW, BULKY):  # the keys in force before the refused reload
        assert call(tenanted, key)[0] in (200, 429), key
    os.kill(tenanted.pid, signal.SIGHUP)  # the same, by signal: refused, logged with the line
    wait_for(lambda: tenanted.logs().count("reload_refused") >= 2, 30, "the SIGHUP refusal")
    assert "line 2: rate must be a number" in tenanted.logs()
    assert call(tenanted, NEW)[0] == 200
    keyfile.write_text(KEYS)  # and back: NEW is gone
    assert tenanted.ctl({"cmd": "reload", "key": SINGLE})["ok"]
    assert call(tenanted, NEW)[0] == 401
    assert "delta" in stats(tenanted)  # what a tenant was answered stays counted


def test_the_tenant_table_of_stats_and_the_dashboard(tenanted: ServerProc) -> None:
    rows = stats(tenanted)
    assert {"alpha", "beta", "gamma", ""} <= set(rows)  # "" is the unnamed --api-key
    beta = rows["beta"]
    assert beta["rate"] == [SLOW_RATE] and beta["keys"] == 1 and beta["priority"] == ["interactive"]
    page = tenanted.request("GET", "/dashboard", headers=OPERATOR)[2].decode()
    assert 'id="tenants"' in page
    for field in ("tenant", "priority", "rate", "requests", "ok", "limited", "refused", "texts"):
        assert f'"{field}"' in page and field in beta  # what the page reads is there
