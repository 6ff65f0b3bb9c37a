"""The CUDA path, tested on a machine with no GPU: the GPU is FAKED here.

CudaRunner runs on device "cpu" (no graphs, no pinned memory) as the "fake GPU": its static
shapes, buffers and the out-of-memory fallback are the production code, while the CUDA-only parts
(graph capture and replay, pinned copies, NVML on a real driver) are checked on a GPU machine by
benchmarks/gpu_check.py. Three failures a GPU can have are SIMULATED through test-only hooks the
server passes on from the environment: an out-of-memory error in a batch
(RINGSERVE_TEST_INJECT_OOM; the same torch.cuda.OutOfMemoryError a real one raises), a failed
graph capture (RINGSERVE_TEST_CAPTURE_ERROR; a RuntimeError where torch.cuda.graph would raise
one) and a device that refuses a worker at boot (RINGSERVE_TEST_DEVICE_BOOT_ERRORS; the first N
worker boots raise the DeviceError a busy or full GPU gives).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from ringserve.service.config.settings import Config
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.logs import EventLog
from ringserve.service.models.device import resolve_device
from ringserve.service.pool.placement import gpu_indices
from ringserve.service.pool.policy import DEVICE_RETRIES
from ringserve.service.pool.supervisor import Supervisor
from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock
from ringserve.shm.segment import Segment, segment_name
from ringserve.workers.artifact import load_model, load_tokenizer
from ringserve.workers.batches import Item
from ringserve.workers.process.batcher import batch_limits, bucket_index
from ringserve.workers.runtimes import nvml
from ringserve.workers.runtimes.cpu import CpuRunner
from ringserve.workers.runtimes.cuda import (
    CAPTURE_FAILED,
    MAX_GRAPHS,
    CudaRunner,
    FallbackRunner,
    first_line,
    gpu_batch_limits,
    graph_sizes,
    is_out_of_memory,
    padded_rows,
)
from ringserve.workers.spec import FAKE_GPU

from devkit.server import wait_for

BUCKETS = (16, 32)  # short buckets keep CPU forwards cheap; the code is the same for 64..256
FAKE_ENV = {"RINGSERVE_TEST_FAKE_GPU": "1"}


@pytest.fixture(scope="module")
def model(default_model: str) -> Any:
    return load_model(default_model)


@pytest.fixture(scope="module")
def items(default_model: str, sst2_texts: list[str]) -> list[Item]:
    tok = load_tokenizer(default_model, max(BUCKETS))
    return [Item(i, 0, 0, e.ids) for i, e in enumerate(tok.encode_batch(sst2_texts[:120]))]


def by_bucket(items: list[Item]) -> list[list[Item]]:
    out: list[list[Item]] = [[] for _ in BUCKETS]
    for it in items:
        out[bucket_index(BUCKETS, len(it.ids))].append(it)
    return out


# -- shape selection --------------------------------------------------------------------------
def test_graph_sizes_cover_every_batch_with_at_most_double_padding() -> None:
    assert graph_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert graph_sizes(12) == [1, 2, 4, 8, 12]
    assert graph_sizes(1) == [1]
    for limit in (1, 5, 8, 12, 32, 100):
        sizes = graph_sizes(limit)
        for n in range(1, limit + 1):
            rows = padded_rows(sizes, n)
            assert n <= rows <= max(1, 2 * n - 1) or rows == limit
            assert rows in sizes
        with pytest.raises(ValueError):
            padded_rows(sizes, limit + 1)


def test_runner_shapes_follow_the_batch_limits(model: Any) -> None:
    runner = CudaRunner(model, (64, 128, 256), 32, FAKE_GPU)
    assert runner.limits == batch_limits((64, 128, 256), 32) == [32, 16, 8]
    assert runner.sizes == [[1, 2, 4, 8, 16, 32], [1, 2, 4, 8, 16], [1, 2, 4, 8]]
    assert [runner.rows_for(0, n) for n in (1, 2, 3, 5, 17, 32)] == [1, 2, 4, 8, 32, 32]
    assert [runner.rows_for(2, n) for n in (1, 3, 7, 8)] == [1, 4, 8, 8]
    assert [t.shape[1] for t in runner.dev_ids] == [64, 128, 256]
    assert not runner.use_graphs and not runner.on_cuda  # the fake GPU captures nothing
    assert runner.graphs.expected == 0


GRID = (16, 32, 48, 64, 96, 128, 192, 256)  # the CUDA default grid (issue 10)


def test_the_gpu_grid_is_sized_for_a_gpu_and_bounded() -> None:
    # 128 rows per batch and at most 16384 padded tokens: 85 rows at 192, 64 at 256.
    limits = gpu_batch_limits(GRID, 128, 16384)
    assert limits == [128, 128, 128, 128, 128, 128, 85, 64]
    count = sum(len(graph_sizes(n)) for n in limits)
    assert count == 6 * 8 + 8 + 7 == 63 <= MAX_GRAPHS
    assert gpu_batch_limits(GRID, 8, 0) == [8] * 8  # no token budget: rows only
    too_many = tuple(range(16, 16 + 16 * 20, 16))  # 20 buckets x 9 sizes: refused, not captured
    with pytest.raises(ValueError, match="CUDA graphs"):
        CudaRunner(StubModel(), too_many, 256, FAKE_GPU, max_tokens=0)


# -- buffers and results ------------------------------------------------------------------------
def test_fake_gpu_matches_cpu_and_allocates_nothing_per_batch(
    model: Any, items: list[Item]
) -> None:
    gpu = CudaRunner(model, BUCKETS, 8, FAKE_GPU)
    cpu = CpuRunner(model, max(BUCKETS), 8)
    gpu.warm()
    cpu.warm()
    ptrs = gpu.buffer_ptrs()
    ids_views = [a.__array_interface__["data"][0] for a in gpu.ids]
    batches = 0
    for bucket, group in enumerate(by_bucket(items)):
        assert len(group) >= 2 * gpu.limits[bucket]
        start = 0
        for n in (1, 3, gpu.limits[bucket], 2, 5, 1, gpu.limits[bucket], 7):  # padded and exact
            batch = group[start : start + min(n, gpu.limits[bucket])]
            start = (start + len(batch)) % gpu.limits[bucket]
            assert gpu.fill(BUCKETS[bucket], batch) == cpu.fill(BUCKETS[bucket], batch)
            got = gpu.forward(BUCKETS[bucket], len(batch))
            want = cpu.forward(BUCKETS[bucket], len(batch))
            assert got.shape == want.shape == (len(batch), 2)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
            batches += 1
    assert batches == 16
    assert gpu.buffer_ptrs() == ptrs  # the same buffers served every batch
    assert [a.__array_interface__["data"][0] for a in gpu.ids] == ids_views


class StubModel:
    """Logits from a preallocated tensor: isolates the runner's own work from the model's."""

    def __init__(self) -> None:
        self.logits = torch.zeros(64, 2)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.logits[: ids.shape[0]]

    def parameters(self) -> list[torch.Tensor]:
        return []  # no weights to move


def tensor_allocations(work: Any) -> int:
    """How many CPU tensor allocations torch's profiler records while `work()` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work()
    return sum(1 for e in prof.events() if e.cpu_memory_usage > 0)


def test_the_runner_allocates_no_tensor_per_batch(items: list[Item]) -> None:
    runner = CudaRunner(StubModel(), BUCKETS, 8, FAKE_GPU)
    runner.warm()
    batch = by_bucket(items)[0]

    def serve() -> None:
        for i in range(60):
            n = 1 + i % 8
            runner.fill(BUCKETS[0], batch[:n])
            runner.forward(BUCKETS[0], n)

    assert tensor_allocations(lambda: torch.zeros(8) + 1) >= 2  # the counter does count
    assert tensor_allocations(serve) == 0


def test_padded_rows_do_not_change_a_text_s_scores(model: Any, items: list[Item]) -> None:
    gpu = CudaRunner(model, BUCKETS, 8, FAKE_GPU)
    gpu.warm()
    group = by_bucket(items)[0]
    gpu.fill(BUCKETS[0], group[:8])
    gpu.forward(BUCKETS[0], 8)  # leaves other texts in rows 3..7
    gpu.fill(BUCKETS[0], group[:3])
    three = gpu.forward(BUCKETS[0], 3)  # padded to 4 rows: row 3 holds a stale text
    gpu.fill(BUCKETS[0], group[:1])
    one = gpu.forward(BUCKETS[0], 1)
    np.testing.assert_allclose(three[0], one[0], atol=1e-5, rtol=0)


def test_bf16_autocast_runs_and_stays_close(model: Any, items: list[Item]) -> None:
    fp32 = CudaRunner(model, BUCKETS, 8, FAKE_GPU)
    bf16 = CudaRunner(model, BUCKETS, 8, FAKE_GPU, precision="bf16")
    # Weights are cast once, on the runner's own copy (a graph then never re-casts them); the
    # caller's model is left as it was.
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32} and fp32.model is model
    fp32.warm()
    bf16.warm()
    batch = by_bucket(items)[0][:8]
    fp32.fill(BUCKETS[0], batch)
    bf16.fill(BUCKETS[0], batch)
    a, b = fp32.forward(BUCKETS[0], len(batch)), bf16.forward(BUCKETS[0], len(batch))
    assert b.dtype == np.float32 and np.isfinite(b).all()
    assert 0 < np.abs(a - b).max() < 0.1  # autocast took effect, and cost little
    with pytest.raises(ValueError):
        CudaRunner(model, BUCKETS, 8, FAKE_GPU, precision="int3")


# -- the fallback wrapper ------------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.pieces = 0  # CPU re-run pieces (each keeps the heartbeat fresh)

    def degraded(self, reason: str) -> None:
        self.events.append("degraded")

    def recovered(self, seconds: float) -> None:
        self.events.append("recovered")

    def fell_back(self) -> None:
        self.events.append("cpu")

    def alive(self) -> None:
        self.pieces += 1


def test_fallback_reruns_on_cpu_then_probes_back(model: Any, items: list[Item]) -> None:
    gpu = CudaRunner(model, BUCKETS, 8, FAKE_GPU)
    cpu = CpuRunner(model, max(BUCKETS), 8)
    sink = Recorder()
    runner = FallbackRunner(gpu, cpu, sink, inject_oom=2, probe_every=2, probe_after_s=1e9)
    runner.warm()
    reference = CpuRunner(model, max(BUCKETS), 8)
    group = by_bucket(items)[0]
    for i in range(6):
        batch = group[i * 3 : i * 3 + 3]
        runner.fill(BUCKETS[0], batch)
        got = runner.forward(BUCKETS[0], len(batch))
        reference.fill(BUCKETS[0], batch)
        np.testing.assert_allclose(
            got, reference.forward(BUCKETS[0], len(batch)), atol=1e-5, rtol=0
        )
    # OOM -> cpu, cpu, probe OOM -> cpu, cpu, probe ok, gpu: one transition each way.
    assert sink.events == ["degraded", "cpu", "cpu", "cpu", "cpu", "recovered"]
    assert runner.fallbacks == 4 and not runner.degraded and runner.inject_oom == 0


def test_a_gpu_sized_batch_is_rerun_on_the_cpu_in_short_pieces(
    model: Any, items: list[Item]
) -> None:
    gpu = CudaRunner(model, BUCKETS, 16, FAKE_GPU, max_tokens=0)  # 16 rows, as a GPU's would be
    sink = Recorder()
    runner = FallbackRunner(gpu, CpuRunner(model, max(BUCKETS), 16), sink, 2, cpu_tokens=64)
    runner.warm()
    reference = CpuRunner(model, max(BUCKETS), 16)
    for bucket, group in enumerate(by_bucket(items)):
        batch = group[: gpu.limits[bucket]]
        assert len(batch) == 16
        pieces = sink.pieces
        runner.fill(BUCKETS[bucket], batch)
        got = runner.forward(BUCKETS[bucket], len(batch))  # an injected OOM: re-run on the CPU
        assert sink.pieces - pieces == 16 * BUCKETS[bucket] // 64  # 64 padded tokens a piece
        reference.fill(BUCKETS[bucket], batch)
        want = reference.forward(BUCKETS[bucket], len(batch))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_a_real_torch_oom_error_is_what_the_wrapper_catches(model: Any, items: list[Item]) -> None:
    class Exploding(CudaRunner):
        def forward(self, length: int, n: int) -> np.ndarray:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    sink = Recorder()
    runner = FallbackRunner(
        Exploding(model, BUCKETS, 8, FAKE_GPU), CpuRunner(model, max(BUCKETS), 8), sink
    )
    runner.warm()
    runner.fill(BUCKETS[0], by_bucket(items)[0][:2])
    assert runner.forward(BUCKETS[0], 2).shape == (2, 2)
    assert sink.events == ["degraded", "cpu"] and runner.degraded


def test_the_script_interpreter_s_wrapped_oom_is_caught_and_other_errors_are_not(
    model: Any, items: list[Item]
) -> None:
    wrapped = (
        "The following operation failed in the TorchScript interpreter.\nTraceback of "
        "TorchScript (most recent call last):\n  ...\nRuntimeError: CUDA out of memory. Tried "
        "to allocate 96.00 MiB. GPU 0 has a total capacity of 139.81 GiB"
    )

    class Raising(CudaRunner):
        error: Exception = RuntimeError(wrapped)

        def forward(self, length: int, n: int) -> np.ndarray:
            raise self.error

    gpu = Raising(model, BUCKETS, 8, FAKE_GPU)
    sink = Recorder()
    runner = FallbackRunner(gpu, CpuRunner(model, max(BUCKETS), 8), sink)
    runner.warm()
    runner.fill(BUCKETS[0], by_bucket(items)[0][:2])
    assert runner.forward(BUCKETS[0], 2).shape == (2, 2) and sink.events == ["degraded", "cpu"]
    gpu.error = RuntimeError("CUDA error: an illegal memory access was encountered")
    runner.probe_after_s = 0.0
    runner.fill(BUCKETS[0], by_bucket(items)[0][:2])
    with pytest.raises(RuntimeError, match="illegal memory access"):
        runner.forward(BUCKETS[0], 2)


def test_a_failed_capture_is_recorded_and_the_runner_still_serves(
    model: Any, items: list[Item]
) -> None:
    # SIMULATED: the fake GPU captures nothing, so the hook raises where torch.cuda.graph would.
    gpu = CudaRunner(model, BUCKETS, 8, FAKE_GPU)
    gpu.graphs.inject_error = True
    gpu.warm()
    assert gpu.graphs.code == CAPTURE_FAILED and "stream is capturing" in gpu.graphs.error
    assert len(gpu.graphs) == 0 and gpu.graphs.held_bytes() == 0
    batch = by_bucket(items)[0][:3]
    gpu.fill(BUCKETS[0], batch)
    cpu = CpuRunner(model, max(BUCKETS), 8)
    cpu.fill(BUCKETS[0], batch)
    np.testing.assert_allclose(
        gpu.forward(BUCKETS[0], 3), cpu.forward(BUCKETS[0], 3), atol=1e-5, rtol=0
    )


def test_error_text_helpers_survive_odd_messages() -> None:
    assert first_line(RuntimeError("")) == "RuntimeError"  # was an IndexError at boot
    assert first_line(RuntimeError("\n  \nCUDA error: x\nmore")) == "CUDA error: x"
    assert is_out_of_memory(RuntimeError("CUDA driver error: out of memory"))
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access"))


# -- through a real server ------------------------------------------------------------------------
def _post(port: int, texts: list[str], counts: Counter[str], lock: threading.Lock) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/classify", json.dumps({"texts": texts}))
        resp = conn.getresponse()
        body = json.loads(resp.read())
        ok = resp.status == 200 and len(body["results"]) == len(texts)
        key = "ok" if ok else f"status {resp.status}"
    except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
        key = f"error {type(exc).__name__}"
    finally:
        conn.close()
    with lock:
        counts[key] += len(texts)


def test_injected_oom_degrades_then_recovers_with_no_failed_request(
    start_server: Any, sst2_texts: list[str], model: Any, default_model: str
) -> None:
    env = {**FAKE_ENV, "RINGSERVE_TEST_INJECT_OOM": "3"}
    srv = start_server("--device", "fake-gpu", "--workers", "1", "--spares", "0", env=env)
    row = srv.status()["workers"][0]
    assert row["state"] == "ready" and row["device"] == FAKE_GPU
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    states: list[str] = []
    stop = threading.Event()

    def clients(index: int) -> None:
        i = index
        while not stop.is_set() and i < 4000:  # bounded in count, and by stop
            _post(srv.port, [sst2_texts[(i + k) % 500] for k in range(4)], counts, lock)
            i += 3

    threads = [threading.Thread(target=clients, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()

    def seen(state: str) -> bool:
        states.append(srv.status()["workers"][0]["state"])
        return state in states

    try:
        wait_for(lambda: seen("degraded"), 60, "worker degraded after the injected OOM")
        assert srv.status()["workers"][0]["device"] == "cpu"  # serving from the CPU copy
        states.clear()
        wait_for(lambda: seen("ready"), 60, "worker back on the (fake) GPU")
        before = counts["ok"]
        wait_for(lambda: counts["ok"] >= before + 40, 60, "load served after recovery")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert counts["ok"] > 0 and set(counts) == {"ok"}, counts  # zero failed requests
    logs = srv.logs()
    assert logs.count('"worker_degraded"') == 1 and logs.count('"worker_recovered"') == 1, logs
    got = srv.classify(sst2_texts[:5])["results"]  # and the GPU path still scores correctly
    cpu = CpuRunner(model, 256, 8)
    tok = load_tokenizer(default_model, 256)
    batch = [Item(i, 0, 0, e.ids) for i, e in enumerate(tok.encode_batch(sst2_texts[:5]))]
    cpu.fill(256, batch)
    want = cpu.forward(256, 5)
    np.testing.assert_allclose([r["scores"] for r in got], want, atol=1e-5, rtol=0)
    assert srv.stop() == 0


def test_device_boot_errors_are_retried_and_a_failed_capture_is_loud(
    start_server: Any, sst2_texts: list[str]
) -> None:
    # SIMULATED on the fake GPU: the first 2 worker boots fail as a busy GPU does, and the
    # worker that then boots has its graph capture fail.
    env = {
        **FAKE_ENV,
        "RINGSERVE_TEST_DEVICE_BOOT_ERRORS": "2",
        "RINGSERVE_TEST_CAPTURE_ERROR": "1",
    }
    srv = start_server("--device", "fake-gpu", "--workers", "1", "--spares", "0", env=env)
    assert srv.classify(sst2_texts[:3])["results"]  # the server did not stop: it serves
    logs = srv.logs()
    events = [json.loads(x) for x in logs.splitlines() if x.startswith("{")]
    errors = [e for e in events if e["event"] == "worker_device_error"]
    assert [e["failures"] for e in errors] == [1, 2], logs
    assert all(e["next_device"] == FAKE_GPU for e in errors)
    died = [e["exit_code"] for e in events if e["event"] == "worker_died"]
    assert died == [5, 5]  # EXIT_DEVICE_ERROR, not the fatal EXIT_BOOT_ERROR (3)
    failed = [e for e in events if e["event"] == "cuda_graphs_failed"]
    assert len(failed) == 1 and failed[0]["level"] == "error" and failed[0]["capture_error"]
    status, _, body = srv.request("GET", "/v1/stats")
    row = json.loads(body)["workers"][0]
    assert status == 200 and row["device"] == FAKE_GPU
    assert "capture failed" in row["capture_error"] and row["graphs"] == 0
    assert srv.stop() == 0


def test_a_slot_whose_gpu_keeps_failing_is_served_from_the_cpu() -> None:
    sup = Supervisor(Config(workers=2, threads=1), Dispatcher(16), "/nowhere", "cpu")
    sup.placement.device, sup.placement.gpus = "cuda", [0, 1]
    for _ in range(1, DEVICE_RETRIES):
        sup.policy.device_error(1, "cuda:1")
        assert sup.device_for(1) == "cuda:1" and sup.policy.backoff_until[1] > 0  # retried, later
    sup.policy.device_error(1, "cuda:1")
    assert sup.device_for(1) == "cpu" and sup.device_for(0) == "cuda:0"
    sup.reload()  # a reload tries the GPU again
    assert sup.device_for(1) == "cuda:1"


def test_fake_gpu_needs_its_test_switch() -> None:
    log = EventLog(stream=io.StringIO())
    with pytest.raises(SystemExit, match="unknown --device"):
        resolve_device(FAKE_GPU, log)


# -- no GPU, no NVML -------------------------------------------------------------------------------
def test_auto_picks_cpu_here_and_says_why_once() -> None:
    stream = io.StringIO()
    assert resolve_device("auto", EventLog(stream=stream)) == "cpu"
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["device_auto"]
    assert "NVML" in lines[0]["reason"] or "CUDA" in lines[0]["reason"]
    for wanted in ("cuda", "cuda:0"):
        with pytest.raises(SystemExit, match="asked for, but"):
            resolve_device(wanted, EventLog(stream=io.StringIO()))
    with pytest.raises(SystemExit, match="unknown --device"):
        resolve_device("gpu", EventLog(stream=io.StringIO()))


def test_missing_nvml_gives_no_reading_and_never_raises() -> None:
    serial = 1
    real = nvml.Nvml()  # this machine has no NVIDIA driver: pynvml's init fails
    assert real.lib() is None and real.error
    assert real.device_count() == 0 and real.handle(0) is None
    assert real.sample(None) is None and real.local_cpus(0) == []
    assert nvml.cuda_unavailable_reason(real) is not None
    seg = Segment.create(segment_name(os.getpid(), 990_000 + serial, "ctl"), L.CONTROL_BYTES)
    try:
        ctl = ControlBlock(seg, create=True)
        monitor = nvml.GpuMonitor(ctl, 0, nvml=real)
        assert monitor.tick(now=10.0) and not monitor.tick(now=10.5)  # at most once a second
        assert ctl.get("gpu_mem_total") == 0 and ctl.get("gpu_mem_used") == 0
        ctl.close()
    finally:
        seg.close()
        seg.unlink()


class FakeNvml:
    """A stand-in pynvml: `fail` names the calls that raise pynvml.NVMLError."""

    def __init__(self, fail: set[str]) -> None:
        import pynvml

        self.error = pynvml.NVMLError
        self.fail = fail
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            if name in self.fail or ("*" in self.fail and name != "nvmlInit"):
                raise self.error(999)  # NVML_ERROR_UNKNOWN
            return {
                "nvmlInit": None,
                "nvmlDeviceGetCount": 2,
                "nvmlDeviceGetHandleByIndex": f"h{args[0]}" if args else None,
                "nvmlDeviceGetHandleByUUID": f"u{args[0]}" if args else None,
                "nvmlDeviceGetMemoryInfo": SimpleNamespace(used=3 << 30, total=141 << 30),
                "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=37),
                "nvmlDeviceGetTemperature": 41,
                "nvmlDeviceGetPowerUsage": 123456,
                "nvmlDeviceGetCpuAffinity": [0b1111_0000, 0],
                "nvmlDeviceGetPciInfo": SimpleNamespace(busId=b"00000000:3B:00.0"),
            }[name]

        return call


def test_nvml_failures_are_swallowed_and_readings_land_in_the_control_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serial = 2
    assert nvml.Nvml(FakeNvml({"nvmlInit"})).lib() is None  # init fails: no NVML
    broken = nvml.Nvml(FakeNvml({"*"}))  # init works, every query fails (a lost GPU)
    assert broken.lib() is not None
    assert broken.device_count() == 0 and broken.sample(broken.handle(0)) is None
    assert broken.local_cpus(0) == []
    partial = nvml.Nvml(FakeNvml({"nvmlDeviceGetPowerUsage", "nvmlDeviceGetCpuAffinity"}))
    sample = partial.sample(partial.handle(0))
    assert sample is not None and sample.power_mw == -1 and sample.util_milli == 370
    seg = Segment.create(segment_name(os.getpid(), 990_000 + serial, "ctl"), L.CONTROL_BYTES)
    try:
        ctl = ControlBlock(seg, create=True)
        good = nvml.Nvml(FakeNvml(set()))
        nvml.GpuMonitor(ctl, 1, nvml=good).sample()
        assert ctl.get("gpu_index") == 1
        assert (ctl.get("gpu_mem_used"), ctl.get("gpu_mem_total")) == (3 << 30, 141 << 30)
        assert (ctl.get("gpu_util_milli"), ctl.get("gpu_temp_c")) == (370, 41)
        assert ctl.get("gpu_power_mw") == 123456
        ctl.close()
    finally:
        seg.close()
        seg.unlink()
    assert good.local_cpus(0) == [4, 5, 6, 7]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-abc")
    assert good.handle(0) == "h3" and good.handle(1) == "uGPU-abc" and good.handle(2) is None
    assert nvml.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert nvml.sysfs_local_cpus("not a bus id") == []


def test_without_nvml_a_driver_still_lets_torch_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvml = nvml.Nvml(FakeNvml({"nvmlInit"}))  # a `compute`-only container: no libnvidia-ml
    monkeypatch.setattr(nvml, "driver_present", lambda: False)
    assert "no NVIDIA driver" in str(nvml.cuda_unavailable_reason(no_nvml))
    monkeypatch.setattr(nvml, "driver_present", lambda: True)
    reason = str(nvml.cuda_unavailable_reason(no_nvml))
    assert "torch" in reason and "NVML" not in reason  # torch was asked, and said no (CPU torch)


def test_nvml_handles_by_the_uuid_torch_reports() -> None:
    good = nvml.Nvml(FakeNvml(set()))
    assert good.handle_by_uuid("58d3bfa1-aaaa") == "uGPU-58d3bfa1-aaaa"
    assert good.handle_by_uuid("MIG-1234") == "uMIG-1234"
    assert nvml.Nvml(FakeNvml({"nvmlDeviceGetHandleByUUID"})).handle_by_uuid("x") is None
    serial = 3
    seg = Segment.create(segment_name(os.getpid(), 990_000 + serial, "ctl"), L.CONTROL_BYTES)
    try:
        ctl = ControlBlock(seg, create=True)  # no CUDA device here: torch cannot say; by index
        assert nvml.GpuMonitor(ctl, 1, torch.device("cpu"), nvml=good).handle == "h1"
        ctl.close()
    finally:
        seg.close()
        seg.unlink()


# -- placement ------------------------------------------------------------------------------------
def test_workers_spread_over_gpus_pinned_near_each() -> None:
    assert gpu_indices("cpu") == [] and gpu_indices("cuda:3") == [3]
    assert gpu_indices(FAKE_GPU) == [0] and gpu_indices("cuda") == []  # no CUDA here
    sup = Supervisor(Config(workers=4, threads=2), Dispatcher(16), "/nowhere", "cpu")
    sup.placement.ncpu = list(range(16))
    sup.placement.device = "cuda"
    sup.placement.gpus = [0, 1]
    sup.placement.gpu_cpus = {0: list(range(8)), 1: list(range(8, 16))}
    assert [sup.device_for(s) for s in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    # A GPU worker may use every CPU near its GPU, not one core.
    near = [list(range(8)), list(range(8, 16))] * 2
    assert [sup.cpus_for(s) for s in range(4)] == near
    sup.placement.gpu_cpus = {}  # the system does not say: every CPU
    assert [sup.cpus_for(s) for s in range(4)] == [list(range(16))] * 4
    assert sup.cpus_for(None) == list(range(16))
    # On the CPU: disjoint sets of --threads cores.
    sup.placement.device, sup.placement.gpus = "cpu", []
    assert [sup.cpus_for(s) for s in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_spares_are_placed_per_gpu_and_promoted_on_their_own() -> None:
    sup = Supervisor(Config(workers=2, threads=1), Dispatcher(16), "/nowhere", "cpu")
    sup.placement.device, sup.placement.gpus = "cuda", [0, 1]

    def spare(device: str) -> Any:
        return SimpleNamespace(device=device, generation=0, dead=False, loaded=lambda: True)

    assert sup.device_for(None) == "cuda:0"
    sup.spares.append(spare("cuda:0"))
    assert sup.device_for(None) == "cuda:1"  # the next spare goes to the GPU without one
    sup.spares.append(spare("cuda:1"))
    assert sup._ready_spare("cuda:1") is sup.spares[1]  # slot 1 takes the spare on its GPU
    assert sup._ready_spare("cuda:0") is sup.spares[0]
    sup.spares.pop(0)
    assert sup._ready_spare("cuda:0") is None  # never a spare from the other GPU


# -- the device script -----------------------------------------------------------------------------
def test_gpu_check_parses_its_arguments_without_a_gpu() -> None:
    import subprocess
    import sys

    from benchmarks import gpu_check
    from devkit.launcher import ROOT

    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "--only" in done.stdout and "--pack" in done.stdout
    args = gpu_check.parse_args(["--quick", "--only", "server,oom"])
    assert args.only == {"server", "oom"} and args.load_s <= 3 and args.device == "cuda:0"
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--only", "everything"])
    texts = gpu_check.make_texts(["short one", "another"], 6)
    assert len(texts) == 6 and len(texts[2]) > len(texts[1]) > len(texts[0])


def test_gpu_check_dry_run_lists_every_row_and_fails_without_cuda(tmp_path: Any) -> None:
    import subprocess
    import sys

    from benchmarks import gpu_check
    from devkit.launcher import ROOT

    def dry(*extra: str) -> tuple[int, str, dict[str, Any]]:
        out = tmp_path / "-".join(extra or ("cuda",))
        done = subprocess.run(
            [sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(out), *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        return done.returncode, done.stdout, json.loads((out / "gpu_check.json").read_text())

    code, text, doc = dry()  # this machine has no CUDA: the first row fails, cleanly
    assert code == 1, text
    assert [(r["section"], r["check"]) for r in doc["rows"]] == [p[:2] for p in gpu_check.PLAN]
    assert all(check in text for _, check, _ in gpu_check.PLAN)
    env = doc["rows"][0]
    assert env["verdict"] == "FAILED" and "is_available() is False" in env["note"]
    assert all(r["result"] == "not run" for r in doc["rows"][1:])
    code, text, doc = dry("--device", "fake-gpu")  # the same plan, no row failed: exit 0
    assert code == 0 and doc["rows"][0]["verdict"] == "PASS" and not doc["failed"], text
