"""/metrics, /v1/stats, the structured log events and the collectors behind them.

The exposition is read with prometheus_client's own parser, against a real server with real
traffic; the GPU families, which need CUDA workers, are rendered from real control blocks that
the test fills in as a CUDA worker would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from ringserve.service.ops import metrics as M
from ringserve.service.ops import prometheus as P
from ringserve.service.ops import stats as S
from ringserve.service.protocols.http import protocol_of
from ringserve.shm import layout as L
from ringserve.wire.client import BinaryClient

from devkit.http import HttpConn, http_message
from devkit.metrics import LONG_TEXT, FakeWorker, fake_gpu_exposition
from devkit.server import ServerProc, serving, wait_for

REQUIRED = {
    # family name (as the parser names it) -> (type, label names)
    "ringserve_requests": ("counter", {"protocol", "code"}),
    "ringserve_request_latency_seconds": ("histogram", {"bucket"}),
    "ringserve_batch_size": ("histogram", set()),
    "ringserve_queue_depth": ("gauge", set()),
    "ringserve_inflight": ("gauge", set()),
    "ringserve_worker_up": ("gauge", {"worker"}),
    "ringserve_worker_restarts": ("counter", {"worker"}),
    "ringserve_worker_rss_bytes": ("gauge", {"worker"}),
    "ringserve_request_queued_seconds": ("histogram", {"bucket"}),
    "ringserve_request_model_seconds": ("histogram", {"bucket"}),
    "ringserve_tokens": ("counter", set()),
    "ringserve_padded_tokens": ("counter", set()),
    "ringserve_cpu_fallbacks": ("counter", set()),
    "ringserve_rejected_requests": ("counter", set()),
    "ringserve_timed_out_requests": ("counter", set()),
    "ringserve_worker_state": ("gauge", {"worker", "state"}),
}


def scrape(srv: ServerProc) -> dict[str, Any]:
    status, headers, body = srv.request("GET", "/metrics")
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    """The value of one sample (0 when absent: a labelled counter not yet incremented)."""
    family = sample
    for suffix in ("_total", "_bucket", "_count", "_sum"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in families:
            family = sample[: -len(suffix)]
    for s in families[family].samples if family in families else []:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    return 0.0


def counter_samples(families: dict[str, Any]) -> dict[tuple[str, tuple[Any, ...]], float]:
    out = {}
    for f in families.values():
        if f.type in ("counter", "histogram"):
            for s in f.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    args = ["--workers", "1", "--spares", "0", "--access-log", "1"]
    with serving(ServerProc(tmp_path_factory.mktemp("metrics"), args), 1) as srv:
        yield srv


def test_metrics_parse_with_required_names_and_labels(server: ServerProc) -> None:
    server.classify("warm up the counters")
    families = scrape(server)
    for name, (kind, labels) in REQUIRED.items():
        assert name in families, f"{name} missing from /metrics"
        family = families[name]
        assert family.type == kind, (name, family.type)
        assert family.samples, f"{name} has no samples"
        for s in family.samples:
            assert labels <= set(s.labels), (name, s.labels)
    buckets = json.loads(server.request("GET", "/v1/model")[2])["length_classes"]
    seen = {s.labels["bucket"] for s in families["ringserve_request_latency_seconds"].samples}
    assert seen == {str(b) for b in buckets}
    worker_ids = {str(w["id"]) for w in server.status()["workers"]}
    assert {s.labels["worker"] for s in families["ringserve_worker_up"].samples} == worker_ids
    assert value(families, "ringserve_worker_up", worker="0") == 1
    assert value(families, "ringserve_worker_rss_bytes", worker="0") > 50e6
    assert not any(name.startswith("ringserve_gpu_") for name in families)  # CPU only here


def test_counters_move_with_traffic(server: ServerProc) -> None:
    before = scrape(server)
    texts = ["a fine film", "dull", LONG_TEXT]
    for _ in range(4):
        server.classify(texts)
    server.classify("one more")
    status, _, _ = server.request("POST", "/v1/classify", b"{not json")
    assert status == 400
    after = scrape(server)

    def delta(sample: str, **labels: str) -> float:
        return value(after, sample, **labels) - value(before, sample, **labels)

    # 5 classify answers, and the first scrape's own (counted once written, after it rendered)
    assert delta("ringserve_requests_total", protocol="http", code="200") == 6
    assert delta("ringserve_requests_total", protocol="http", code="400") == 1
    lat = "ringserve_request_latency_seconds_count"
    # Latency is labelled with the text's own length class (/v1/model "length_classes").
    assert delta(lat, bucket="16") == 9
    assert sum(delta(lat, bucket=str(b)) for b in (128, 192, 256)) == 4
    assert delta("ringserve_request_latency_seconds_sum", bucket="16") > 0
    assert delta("ringserve_request_model_seconds_count", bucket="16") == 9
    assert delta("ringserve_request_queued_seconds_count", bucket="16") == 9
    assert delta("ringserve_batch_size_sum") == 13  # texts through the model
    assert 1 <= delta("ringserve_batch_size_count") <= 13
    assert delta("ringserve_tokens_total") > 0
    assert delta("ringserve_padded_tokens_total") >= delta("ringserve_tokens_total")
    assert delta("ringserve_model_busy_seconds_total") > 0
    # No counter or histogram bucket ever goes backwards.
    old, new = counter_samples(before), counter_samples(after)
    for key, v in old.items():
        assert new.get(key, 0.0) >= v, key


def requests_total(body: bytes) -> Counter[tuple[str, int]]:
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return Counter(
        {
            (s.labels["protocol"], int(s.labels["code"])): int(s.value)
            for s in families["ringserve_requests"].samples
            if s.name == "ringserve_requests_total"
        }
    )


def test_every_kind_of_answer_is_counted_once(start_server: Any) -> None:
    """One of each kind of answer, HTTP, KServe, binary and control, including a GET, a 404, a
    framing error and a connection-cap refusal: requests_total moves by exactly what was seen."""
    srv = start_server(
        "--workers", "1", "--spares", "0", "--max-connections", "2", "--max-body", "1024"
    )  # fmt: skip
    infer = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["fine"]}]}
    seen: Counter[tuple[str, int]] = Counter()

    def other_protocols() -> None:
        with BinaryClient("127.0.0.1", srv.binary_port) as client:
            for answer in client.classify_many(["a fine film", b"\xff not utf-8"]):
                seen[("binary", 200 if answer.ok else 400)] += 1
        for cmd in ({"cmd": "status"}, {"cmd": "no-such-command"}):
            seen[("control", 200 if srv.ctl(cmd)["ok"] else 400)] += 1

    async def http_side() -> tuple[bytes, bytes]:
        a = await HttpConn.open(srv.port)  # kept open to the end: it reads the counters
        before = await a.call("GET", "/metrics")
        model = json.loads((await a.call("GET", "/v1/model")).body)["name"]
        seen[("http", 200)] += 2  # the first scrape (counted once written, after it rendered)
        other_protocols()
        asks = [
            ("GET", "/metrics", b""),
            ("GET", "/v1/model", b""),
            ("GET", "/no/such/path", b""),
            ("DELETE", "/v1/classify", b""),
            ("POST", "/v1/classify", b"{not json"),
            ("POST", "/v1/classify", b'{"text": "a fine film"}'),
            ("GET", "/v2/health/live", b""),
            ("GET", "/v2/models/no-such-model", b""),
            ("POST", f"/v2/models/{model}/infer", json.dumps(infer).encode()),
        ]
        for method, path, body in asks:
            answer = await a.call(method, path, body)
            seen[(protocol_of(path.encode()), answer.status)] += 1
        for raw in (b"NOT HTTP AT ALL\r\n\r\n", http_message("POST", "/v1/classify", bytes(2048))):
            closing = await HttpConn.open(srv.port)  # each of these ends its connection
            seen[("http", (await closing.send(raw)).status)] += 1
            assert closing.closed
        b = await HttpConn.open(srv.port)  # the second of two connections allowed
        seen[("http", (await b.call("GET", "/v1/model")).status)] += 1
        c = await HttpConn.open(srv.port)  # the third: refused before it sends anything
        seen[("http", (await c.read_answer()).status)] += 1
        for conn in (b, c):
            conn.close()
        after = await a.call("GET", "/metrics")
        a.close()
        return before.body, after.body

    before, after = asyncio.run(http_side())
    moved = requests_total(after)
    moved.subtract(requests_total(before))
    assert +moved == seen
    # Each kind was there to be counted (a GET, a 404, a framing error, the refusal, ...).
    kinds = {("http", 404), ("http", 405), ("http", 400), ("http", 413), ("http", 503)}
    assert kinds | {("kserve", 404), ("binary", 400), ("control", 400)} <= set(seen), seen


def test_timeouts_are_counted(server: ServerProc) -> None:
    before = scrape(server)
    for _ in range(3):
        status, _, _ = server.request(
            "POST", "/v1/classify", {"text": "too late"}, {"X-Request-Timeout-Ms": "0.001"}
        )
        assert status == 504
    after = wait_for(
        lambda: (
            f
            if value(f := scrape(server), "ringserve_requests_total", code="504")
            - value(before, "ringserve_requests_total", code="504")
            == 3
            else None
        ),
        10,
        "504s counted",
    )
    timed_out = sum(
        value(after, n) - value(before, n)
        for n in ("ringserve_timed_out_requests_total", "ringserve_worker_expired_total")
    )
    # Each text is expired by the front-end or skipped by its worker; a slow worker can still
    # skip one that the front-end already answered, so both counters may hold the same text.
    assert 3 <= timed_out <= 6


def test_stats_match_control_status(server: ServerProc) -> None:
    for _ in range(3):
        server.classify(["first of a few", "second of a few"])
    status, headers, body = server.request("GET", "/v1/stats")
    assert status == 200 and headers["content-type"] == "application/json"
    stats = json.loads(body)
    ctl = server.status()
    key = [(w["id"], w["pid"], w["state"], w["cpus"], w["restarts"]) for w in ctl["workers"]]
    got = [(w["id"], w["pid"], w["state"], w["cpus"], w["restarts"]) for w in stats["workers"]]
    assert got == key
    for w in stats["workers"]:
        assert {"rss_bytes", "heartbeat_age_ms", "device", "inflight", "requests"} <= set(w)
        assert w["rss_bytes"] > 0 and w["requests"] > 0
    for field in ("queue_depth", "inflight", "requests_per_s", "latency_ms", "gpus"):
        assert field in stats, field
    assert stats["queue_depth"] == 0 and stats["inflight"] == 0
    assert stats["requests_per_s"] > 0
    assert stats["gpus"] == []
    buckets = json.loads(server.request("GET", "/v1/model")[2])["length_classes"]
    assert set(stats["latency_ms"]) == {str(b) for b in buckets}
    short = stats["latency_ms"]["16"]
    assert short["count"] >= 6 and 0 < short["p50"] <= short["p99"]
    hist = stats["latency_histogram"]
    assert len(hist["bounds_ms"]) == len(hist["counts"])
    assert sum(hist["counts"]) == sum(v["count"] for v in stats["latency_ms"].values())
    assert len(stats["requests_per_s_history"]) == S.WINDOW_S
    assert stats["totals"]["answered"] >= 6 and 0 <= stats["totals"]["padding_waste"] < 1
    # One model: its entry under `models` is the server's own numbers.
    (name, model), *others = stats["models"].items()
    assert not others and name == stats["model"]["name"] and model["open"]
    assert model["requests"] == sum(stats["totals"]["tasks"].values()) >= 6
    assert model["queue_depth"] == 0 and model["max_queue"] == stats["max_queue"]
    assert 0 < model["latency_ms"]["p50"] <= model["latency_ms"]["p99"]


def test_stats_show_the_estimated_queue_wait(server: ServerProc, sst2_texts: list[str]) -> None:
    """Once the pool has worked long enough to be measured, /v1/stats shows its rate and the
    wait a text admitted now would have (none, on an idle server), and /metrics the gauge."""
    for k in range(4):  # a few hundred texts: more than one rate sample of busy time
        server.classify(sst2_texts[k * 200 : k * 200 + 200])
    stats = json.loads(server.request("GET", "/v1/stats")[2])
    assert stats["max_queue_ms"] == 1000.0
    assert stats["pool_tokens_per_s"] > 0, stats["pool_tokens_per_s"]
    assert stats["queue_wait_ms"] == 0.0  # nothing queued
    text = server.request("GET", "/metrics")[2].decode()
    assert "\nringserve_queue_wait_seconds 0" in text


def test_access_log_lines(server: ServerProc) -> None:
    rid = "access-" + uuid.uuid4().hex[:8]
    status, headers, _ = server.request("GET", "/v1/model", headers={"X-Request-Id": rid})
    assert status == 200 and headers["x-request-id"] == rid

    def line() -> dict[str, Any] | None:
        for raw in server.logs().splitlines():
            if rid in raw:
                record: dict[str, Any] = json.loads(raw)
                return record
        return None

    record = wait_for(line, 5, "access log line")
    assert record["event"] == "access"
    assert record["method"] == "GET" and record["path"] == "/v1/model"
    assert record["status"] == 200 and record["latency_ms"] >= 0


def test_worker_kill_counts_restart_and_keeps_counters(server: ServerProc) -> None:
    server.classify(["before the kill"] * 4)
    before = scrape(server)
    pid = server.worker_pids()[0]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: server.ready_workers() == 1 and server.worker_pids()[0] != pid, 60, "respawn")
    server.classify("after the kill")
    after = scrape(server)
    assert value(after, "ringserve_worker_restarts_total", worker="0") == 1
    assert value(after, "ringserve_worker_up", worker="0") == 1
    old, new = counter_samples(before), counter_samples(after)
    for key, v in old.items():
        assert new.get(key, 0.0) >= v, key  # the dead worker's batches still count
    assert value(after, "ringserve_batch_size_sum") > value(before, "ringserve_batch_size_sum")
    events = [json.loads(x) for x in server.logs().splitlines() if x.startswith("{")]
    died = [e for e in events if e.get("event") == "worker_died" and e.get("pid") == pid]
    assert died and died[0]["exit_code"] == -signal.SIGKILL and died[0]["reason"]


def test_overload_events_and_metrics_off(start_server: Any) -> None:
    """--max-queue 2 with a flood: refusals are counted and logged as one episode; with
    --metrics 0 nothing is counted per request but the rest of /metrics still works."""
    srv = start_server("--workers", "1", "--spares", "0", "--max-queue", "2", "--metrics", "0")
    codes: list[int] = []
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            codes.append(srv.request("POST", "/v1/classify", {"text": "flood"}, timeout=30)[0])

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: codes.count(503) >= 5 and codes.count(200) >= 2, 60, "503s and 200s")
    finally:
        stop.set()
        for t in threads:
            t.join(30)

    def events(name: str) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in srv.logs().splitlines() if x.startswith("{")]
        return [e for e in lines if e.get("event") == name]

    begins = wait_for(lambda: events("overload_begins"), 10, "overload_begins")
    ends = wait_for(lambda: events("overload_ends"), 15, "overload_ends")
    assert begins[0]["level"] == "warning" and begins[0]["max_queue"] == 2
    assert sum(e["rejected"] for e in ends) == codes.count(503)
    families = scrape(srv)
    assert value(families, "ringserve_rejected_requests_total") == codes.count(503)
    http = {"protocol": "http"}  # the readiness probes are KServe's, ctl status is control's
    assert value(families, "ringserve_requests_total", code="503", **http) == codes.count(503)
    assert value(families, "ringserve_requests_total", code="200", **http) == codes.count(200)
    for b in ("16", "32", "64", "256"):  # --metrics 0: no per-request collection
        assert value(families, "ringserve_request_latency_seconds_count", bucket=b) == 0
    assert value(families, "ringserve_batch_size_sum") >= codes.count(200)  # from workers


def test_cpu_fallbacks_counted(start_server: Any) -> None:
    """The test-only fake GPU runs the CUDA code path on the CPU; injected out-of-memory errors
    make its worker re-run batches on its CPU copy, which /metrics and /v1/stats must show."""
    env = {"RINGSERVE_TEST_FAKE_GPU": "1", "RINGSERVE_TEST_INJECT_OOM": "2"}
    srv = start_server("--device", "fake-gpu", "--workers", "1", "--spares", "0", env=env)

    def fallbacks() -> float:
        srv.classify(["fall back", "to the CPU"])
        return value(scrape(srv), "ringserve_cpu_fallbacks_total")

    counted = wait_for(fallbacks, 60, "CPU fallbacks on /metrics")
    assert counted >= 1
    stats = json.loads(srv.request("GET", "/v1/stats")[2])
    assert stats["totals"]["cpu_fallbacks"] >= counted
    assert stats["gpus"] == []  # a fake GPU has no NVML readings


# -- collectors, without a server ---------------------------------------------------------------
def test_fine_edges_hold_every_prometheus_bound() -> None:
    for bound in S.PROM_BOUNDS_S:
        assert round(bound * 1e6) in S.EDGES_US
    fine = [0] * S.NBINS
    for us in (50, 100, 101, 1000, 2_000_000, 10**9):
        fine[S.bisect_left(S.EDGES_US, us)] += 1
    cumulative = S.prom_buckets(fine)
    le = dict(zip([*S.PROM_BOUNDS_S, float("inf")], cumulative, strict=True))
    assert le[0.0001] == 2 and le[0.00025] == 3 and le[0.001] == 4
    assert le[2.5] == 5 and le[30.0] == 5 and le[float("inf")] == 6


def test_percentiles_and_windows() -> None:
    stats = S.Stats((64, 128))
    group: Any = None
    ok = SimpleNamespace(status=0, bucket=0, queued_us=100, model_us=2000)
    for ms in range(1, 101):  # 1..100 ms
        stats.observe(group, ok, ms * 1_000_000)
    stats.observe(group, SimpleNamespace(status=3), 0)
    stats.observe(group, SimpleNamespace(status=0, bucket=7, queued_us=1, model_us=1), 5)
    summary = stats.last_minute()["latency_ms"]
    assert summary["64"]["count"] == 100
    assert 40 <= summary["64"]["p50"] <= 60 and 90 <= summary["64"]["p99"] <= 110
    assert summary["128"]["count"] == 1  # an out-of-range bucket index is clamped
    assert stats.failed == 1
    sec = stats.cur_sec
    stats.rotate((sec + 30) * 1_000_000_000)
    assert stats.last_minute()["latency_ms"]["64"]["count"] == 100
    assert stats.history()[-30] == 102
    stats.rotate((sec + 61) * 1_000_000_000)
    assert stats.last_minute()["latency_ms"]["64"]["count"] == 0  # aged out
    assert sum(stats.lat[0]) == 100  # the Prometheus totals keep everything


def test_gpu_families_from_control_blocks() -> None:
    families = {f.name: f for f in text_string_to_metric_families(fake_gpu_exposition())}
    assert set(families) == set(P.GPU_METRICS)
    used = families["ringserve_gpu_memory_used_bytes"].samples
    assert [(s.labels, s.value) for s in used] == [({"gpu": "1"}, float(3 << 30))]
    util = families["ringserve_gpu_utilization_ratio"].samples[0].value
    assert util == pytest.approx(0.625)
    reserved = families["ringserve_worker_cuda_reserved_bytes"].samples
    assert {s.labels["worker"] for s in reserved} == {"0", "-2"}


def test_unknown_gpu_reading_is_left_out() -> None:
    families = {f.name: f for f in text_string_to_metric_families(fake_gpu_exposition(-1))}
    assert families["ringserve_gpu_power_watts"].samples == []
    assert families["ringserve_gpu_temperature_celsius"].samples[0].value == 55


def test_worker_totals_never_go_backwards() -> None:
    a, b = FakeWorker(1, 0), FakeWorker(2, 1)
    try:
        sup: Any = SimpleNamespace(all={1: a, 2: b})
        totals = S.WorkerTotals()
        a.ctl.set("requests", 10)
        a.ctl.count_batch(10)
        b.ctl.set("requests", 5)
        first = S.WorkerTotals.named(totals.refresh(sup))
        assert first["requests"] == 15
        a.ctl.set("requests", 12)  # counted after the last sample, before release
        totals.retire(a)
        del sup.all[1]
        second = totals.refresh(sup)
        assert S.WorkerTotals.named(second)["requests"] == 17
        assert S.WorkerTotals.batch_hist(second)[L.BATCH_BOUNDS.index(16)] == 1
        del sup.all[2]  # gone without the hook: its last sample still counts
        assert S.WorkerTotals.named(totals.refresh(sup))["requests"] == 17
    finally:
        a.close()
        b.close()


def test_a_slots_count_goes_on_across_replacements() -> None:
    """The dashboard's `served`: slot 0's new process (a restart, a model load's roll) adds to
    what its predecessor served; a spare's counts belong to no slot."""
    old, new, spare = FakeWorker(1, 0), FakeWorker(2, 0), FakeWorker(3, None)
    try:
        sup: Any = SimpleNamespace(all={1: old, 3: spare})
        totals = S.WorkerTotals()
        old.ctl.set("requests", 10)
        spare.ctl.set("requests", 4)
        totals.refresh(sup)
        assert totals.slot_totals(0)[0] == 10
        old.ctl.set("requests", 11)
        totals.retire(old)
        del sup.all[1]
        sup.all[2] = new
        new.ctl.set("requests", 3)
        totals.refresh(sup)
        assert (totals.slot_totals(0)[0], totals.slot_totals(1)[0]) == (14, 0)
        del sup.all[2]  # gone without the hook: still the slot's
        totals.refresh(sup)
        assert totals.slot_totals(0)[0] == 14
    finally:
        for w in (old, new, spare):
            w.close()


def test_dashboard_file_is_packaged() -> None:
    assert M.DASHBOARD.is_file()
    assert (
        M.DASHBOARD.parent == Path(M.__file__).parent / "static"
    )  # shipped as service/ops/static/*
