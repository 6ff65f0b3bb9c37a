"""Checks and times the CUDA path on a GPU machine in one call, and prints one table.

It measures: served scores on CUDA against the CPU reference (max abs diff); CUDA graph replay
against eager latency per bucket at batch 1 and at the bucket's largest batch (and allocator
allocations per batch); fp16/bf16 accuracy cost against fp32; throughput at concurrency 1, 32 and
256 through a real `ringserve serve --device cuda`; GPU memory before and after 60 s of load
(fluctuation in percent); a forced out-of-memory run through the real server (the test hook
RINGSERVE_TEST_INJECT_OOM) with its failed-request count; and a real out-of-memory error
(the GPU filled by this process) caught by the fallback, in-process. Each section that fails is
reported as FAILED in the table and the rest go on; the whole run fits 8 minutes (--budget-s).

Prepare here, on a machine without a GPU, from the repo root (the device machine has no network,
no httptools and no default-model package; python 3.12 and torch are there):

    grep -qx '/.gpucheck/' .git/info/exclude || echo /.gpucheck/ >> .git/info/exclude
    .venv/bin/python benchmarks/gpu_check.py --pack .gpucheck      # fp16 encoder + texts, ~46 MB
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 -d .whl httptools==0.9.0

Then one device call, `run` with carry [".whl", ".gpucheck"] and timeout_s 540:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; \\
    set -o pipefail; PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out $OUT 2>&1 \\
        | tee $OUT/gpu_check.log

The encoder weights travel as fp16 (the 90 MB fp32 file is over the carry limit); the artifact
built from them on the device is an fp32 model like any other, and every comparison here is
between runs of that same artifact. A rehearsal on a CPU machine runs every section that needs
no CUDA: `python benchmarks/gpu_check.py --device fake-gpu --quick`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

BUCKETS = (64, 128, 256)
MAX_BATCH = 32
DATA = ROOT / "data"
SECTIONS = ("graphs", "precision", "server", "oom", "realoom")


# -- arguments -------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpu_check.py",
        description="Check and time ringserve's CUDA path in one run (see the module docstring).",
    )
    p.add_argument("--device", default="cuda:0", help="cuda:K, or fake-gpu for a CPU rehearsal")
    p.add_argument("--model", default=None, help="a model artifact directory to use as is")
    p.add_argument(
        "--encoder",
        default=str(ROOT / ".gpucheck" / "encoder"),
        help="encoder dir to build the artifact from (made by --pack)",
    )
    p.add_argument("--texts", default=str(ROOT / ".gpucheck" / "texts.txt"), help="one per line")
    p.add_argument("--workers-per-gpu", type=int, default=2, help="for the server runs")
    p.add_argument("--load-s", type=float, default=10.0, help="seconds per concurrency level")
    p.add_argument("--soak-s", type=float, default=60.0, help="seconds of load for the memory")
    p.add_argument("--oom-batches", type=int, default=5, help="injected OOMs per worker")
    p.add_argument("--budget-s", type=float, default=450.0, help="skip sections past this")
    p.add_argument("--quick", action="store_true", help="short loads and fewer texts")
    p.add_argument("--out", default=None, help="folder for gpu_check.json and the server logs")
    p.add_argument("--pack", default=None, metavar="DIR", help="only write DIR for the device")
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run, of {','.join(SECTIONS)}",
    )
    args = p.parse_args(argv)
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    if args.only - set(SECTIONS):
        p.error(f"--only: unknown sections {sorted(args.only - set(SECTIONS))}")
    args.reps = 3 if args.quick else 50
    if args.quick:
        args.load_s, args.soak_s = min(args.load_s, 3.0), min(args.soak_s, 6.0)
    return args


# -- the table -------------------------------------------------------------------------------------
class Table:
    def __init__(self, budget_s: float) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.data: dict[str, Any] = {}

    def add(self, section: str, item: str, value: Any, note: str = "") -> None:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        self.rows.append((section, item, text, note))
        print(f"[{time.monotonic() - self.started:6.1f}s] {section} | {item} | {text} | {note}")

    @contextlib.contextmanager
    def section(self, name: str, cost_s: float = 0.0) -> Iterator[bool]:
        """Runs a section unless the budget is spent; a failure becomes a FAILED row."""
        left = self.budget_s - (time.monotonic() - self.started)
        if left < cost_s:
            self.add(name, "skipped", "-", f"time budget ({left:.0f}s left, needs ~{cost_s:.0f}s)")
            yield False
            return
        try:
            yield True
        except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others
            self.add(name, "FAILED", type(exc).__name__, str(exc).splitlines()[0][:160])
            traceback.print_exc()

    def render(self) -> str:
        widths = [max(len(r[i]) for r in [("section", "check", "result", "note"), *self.rows])
                  for i in range(4)]  # fmt: skip
        line = " | ".join(f"{{:{w}}}" for w in widths)
        out = [line.format("section", "check", "result", "note")]
        out.append("-+-".join("-" * w for w in widths))
        out += [line.format(*r) for r in self.rows]
        return "\n".join(out)


# -- inputs ----------------------------------------------------------------------------------------
def pack(dest: str) -> None:
    """Write the encoder (weights as fp16) and some texts into `dest`, to carry to the device."""
    import shutil

    from safetensors.torch import load_file, save_file

    from workers.artifact import default_encoder_dir

    src, out = default_encoder_dir(), Path(dest)
    (out / "encoder").mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    half = {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}
    save_file(half, str(out / "encoder" / "model.safetensors"))
    for name in ("config.json", "tokenizer.json"):
        shutil.copyfile(src / name, out / "encoder" / name)
    texts: list[str] = []
    for name, n in (("sst2", 1500), ("ag_news", 500)):
        rows = (DATA / name / "sample.tsv").read_text(encoding="utf-8").splitlines()[1 : n + 1]
        texts += [r.split("\t")[0] for r in rows]
    (out / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    print(f"wrote {out}: encoder (fp16 weights) and {len(texts)} texts")


def make_texts(base: list[str], n: int) -> list[str]:
    """`n` texts of mixed lengths (short ones, and joins of several that reach 128 and 256)."""
    out = []
    for i in range(n):
        parts = 1 if i % 3 == 0 else (3 if i % 3 == 1 else 12)
        out.append(" ".join(base[(i * 7 + k) % len(base)] for k in range(parts)))
    return out


def read_texts(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    lines = [x for x in lines if x.strip()]
    if lines:
        return lines
    words = ["the", "film", "was", "great", "dull", "long", "plot", "story", "good", "bad"]
    return [" ".join(words[(i + k) % len(words)] for k in range(4 + i % 20)) for i in range(400)]


def artifact_dir(args: argparse.Namespace, table: Table) -> str:
    if args.model:
        return str(args.model)
    encoder = Path(args.encoder)
    if not (encoder / "model.safetensors").is_file():
        from workers.artifact import default_artifact_dir

        return str(default_artifact_dir())  # where the default model's package is installed
    from workers.artifact import DEFAULT_HEAD, build_artifact, read_head

    head, info = read_head(DEFAULT_HEAD)
    out = Path(tempfile.mkdtemp(prefix="gpucheck-")) / "model"
    t0 = time.monotonic()
    build_artifact(out, encoder, head, "gpucheck-minilm", info["labels"], 256)
    table.add("setup", "artifact built", f"{time.monotonic() - t0:.1f}s", str(out))
    return str(out)


# -- in-process runner checks ----------------------------------------------------------------------
def tokenize(model_dir: str, texts: list[str]) -> list[Any]:
    from workers.artifact import load_tokenizer
    from workers.batcher import Item

    tok = load_tokenizer(model_dir, max(BUCKETS))
    return [Item(i, 0, 0, e.ids) for i, e in enumerate(tok.encode_batch(texts))]


def score_all(runner: Any, items: list[Any]) -> Any:
    """Probabilities for every item, batched by bucket as a worker would."""
    import numpy as np

    from workers.batcher import bucket_index

    out = np.zeros((len(items), 2), dtype=np.float32)
    groups: dict[int, list[Any]] = {}
    for it in items:
        groups.setdefault(bucket_index(BUCKETS, len(it.ids)), []).append(it)
    for b, group in groups.items():
        limit = runner.limits[b] if hasattr(runner, "limits") else MAX_BATCH
        for i in range(0, len(group), limit):
            batch = group[i : i + limit]
            runner.fill(runner.buckets[b], batch)
            probs = runner.forward(runner.buckets[b], len(batch))
            for row, it in enumerate(batch):
                out[it.msg_id] = probs[row]
    return out


def synthetic(bucket_len: int, n: int) -> list[Any]:
    from workers.batcher import Item

    return [
        Item(i, 0, 0, [101] + [2000 + (i * 31 + k * 7) % 20000 for k in range(bucket_len - 2)]
             + [102])
        for i in range(n)
    ]  # fmt: skip


def median_ms(fn: Callable[[], Any], reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def cuda_model(model_dir: str, device: str) -> Any:
    from workers.artifact import load_model

    return load_model(model_dir, "cpu" if device == "fake-gpu" else device)


def check_graphs(args: argparse.Namespace, table: Table, model_dir: str, items: list[Any]) -> Any:
    """Capture report, replay vs eager per bucket, allocations per batch, padding invariance."""
    import numpy as np
    import torch

    from workers.cuda import CudaRunner

    runner = CudaRunner(cuda_model(model_dir, args.device), BUCKETS, MAX_BATCH, args.device)
    warm_s = runner.warm()
    table.add("graphs", "captured", len(runner.graphs), f"warm+capture {warm_s:.2f}s")
    table.add("graphs", "graph memory", f"{runner.graph_bytes() / 2**20:.1f} MiB", "reserved")
    if runner.capture_error:
        table.add("graphs", "capture error", "yes", runner.capture_error)
    for s in runner.graph_stats:
        table.add("graphs", f"capture b{s['bucket']} x{s['rows']}", f"{s['capture_ms']} ms",
                  f"{s['bytes'] / 2**20:.1f} MiB")  # fmt: skip
    table.data["graph_stats"] = runner.graph_stats
    reps = args.reps
    for b, length in enumerate(BUCKETS):
        for n in (1, runner.limits[b]):
            runner.fill(length, synthetic(length, n))
            replay = median_ms(partial(runner.forward, length, n), reps)
            eager = median_ms(partial(runner.forward_eager, length, n), max(5, reps // 3))
            table.add("latency", f"bucket {length} batch {n}", f"{replay:.3f} ms",
                      f"eager {eager:.3f} ms, x{eager / replay:.1f}")  # fmt: skip
    if runner.on_cuda:

        def allocs(fn: Callable[[], Any]) -> int:
            before = torch.cuda.memory_stats(runner.torch_device)["allocation.all.allocated"]
            for _ in range(20):
                fn()
            return int(torch.cuda.memory_stats(runner.torch_device)["allocation.all.allocated"]
                       - before)  # fmt: skip

        runner.fill(BUCKETS[0], synthetic(BUCKETS[0], 7))
        table.add("allocs", "per 20 batches, graph", allocs(lambda: runner.forward(BUCKETS[0], 7)),
                  f"eager: {allocs(lambda: runner.forward_eager(BUCKETS[0], 7))}")  # fmt: skip
    short = [it for it in items if len(it.ids) <= BUCKETS[0]]
    runner.fill(BUCKETS[0], short[:1])
    alone = runner.forward(BUCKETS[0], 1)[0]
    batch = short[: runner.limits[0] - 3]  # padded up to the next captured size
    runner.fill(BUCKETS[0], batch)
    inside = runner.forward(BUCKETS[0], len(batch))[0]
    table.add("scores", "same text alone vs in a batch", float(np.abs(alone - inside).max()),
              "max abs diff; fp32 promise 1e-5")  # fmt: skip
    return runner


def check_precision(args: argparse.Namespace, table: Table, model_dir: str, items: list[Any],
                    fp32: Any) -> None:  # fmt: skip
    import numpy as np

    from workers.cuda import CudaRunner

    base = score_all(fp32, items)
    model = fp32.model
    for precision in ("fp16", "bf16"):
        runner = CudaRunner(model, BUCKETS, MAX_BATCH, args.device, precision)
        runner.warm()
        probs = score_all(runner, items)
        diff = np.abs(probs - base)
        flips = int((probs.argmax(1) != base.argmax(1)).sum())
        table.add("precision", f"{precision} vs fp32 max abs diff", float(diff.max()),
                  f"mean {diff.mean():.2e}; argmax flips {flips}/{len(items)}")  # fmt: skip
        b = len(BUCKETS) - 1
        runner.fill(b, synthetic(BUCKETS[b], runner.limits[b]))
        fp32.fill(b, synthetic(BUCKETS[b], fp32.limits[b]))
        t = median_ms(partial(runner.forward, b, runner.limits[b]), max(3, args.reps // 2))
        t32 = median_ms(partial(fp32.forward, b, fp32.limits[b]), max(3, args.reps // 2))
        table.add("precision", f"{precision} bucket {BUCKETS[b]} x{runner.limits[b]}",
                  f"{t:.3f} ms", f"fp32 {t32:.3f} ms")  # fmt: skip
        del runner


def check_real_oom(args: argparse.Namespace, table: Table, model_dir: str) -> None:
    """Fill the GPU from this process, then run an eager batch: the real error is caught."""
    import torch

    from workers.cuda import CudaRunner, FallbackRunner
    from workers.runtime import CpuRunner

    events: list[str] = []

    class Sink:
        def degraded(self, reason: str) -> None:
            events.append("degraded: " + reason[:60])

        def recovered(self, seconds: float) -> None:
            events.append("recovered")

        def fell_back(self) -> None:
            events.append("cpu")

    dev = torch.device(args.device)
    model = cuda_model(model_dir, args.device)
    graphs = CudaRunner(model, BUCKETS, MAX_BATCH, args.device)
    eager = CudaRunner(model, BUCKETS, MAX_BATCH, args.device, graphs=False)
    cpu = CpuRunner(cuda_model(model_dir, "fake-gpu"), BUCKETS, MAX_BATCH)
    runner = FallbackRunner(eager, cpu, Sink(), probe_every=1, probe_after_s=0.0)
    graphs.warm()
    runner.warm()
    hog = []
    for chunk in (1 << 30, 1 << 26, 1 << 21):  # plain cudaMalloc through torch, no managed memory
        with contextlib.suppress(torch.cuda.OutOfMemoryError):
            while True:
                hog.append(torch.empty(chunk, dtype=torch.uint8, device=dev))
    held = sum(t.numel() for t in hog)
    b = len(BUCKETS) - 1
    items = synthetic(BUCKETS[b], runner.primary.limits[b])
    graphs.fill(b, items)
    graphs.forward(b, len(items))  # a replay allocates nothing: it runs with the GPU full
    runner.fill(b, items)
    probs = runner.forward(b, len(items))
    table.add("real OOM", "GPU filled by this process", f"{held / 2**30:.1f} GiB",
              "graph replay still ran")  # fmt: skip
    table.add("real OOM", "eager batch under full memory", f"{len(probs)} rows served",
              "; ".join(events) or "no OOM raised")  # fmt: skip
    hog.clear()
    torch.cuda.empty_cache()
    runner.fill(b, items)
    runner.forward(b, len(items))
    table.add("real OOM", "after memory freed", "gpu" if not runner.degraded else "still cpu",
              f"fallbacks {runner.fallbacks}; events {events[-1:]}")  # fmt: skip


# -- the real server -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A `ringserve serve` child process on free ports."""

    def __init__(self, args: argparse.Namespace, model_dir: str, env: dict[str, str],
                 tag: str) -> None:  # fmt: skip
        self.port = free_port()
        self.control = os.path.join(tempfile.mkdtemp(prefix="gpucheck-"), "ctl.sock")
        out = Path(args.out or tempfile.mkdtemp(prefix="gpucheck-"))
        out.mkdir(parents=True, exist_ok=True)
        self.log_path = out / f"server-{tag}.log"
        full_env = {**os.environ, **env}
        if args.device == "fake-gpu":
            full_env["RINGSERVE_TEST_FAKE_GPU"] = "1"
        device = args.device if args.device == "fake-gpu" else "cuda"
        cmd = [sys.executable, "-m", "service.cli", "serve", "--model", model_dir,
               "--device", device, "--workers-per-gpu", str(args.workers_per_gpu),
               "--spares", "0", "--port", str(self.port), "--binary-port", "0",
               "--control", self.control, "--max-queue", "4096"]  # fmt: skip
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=self.log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        self.started = time.monotonic()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, json.loads(data) if data.startswith((b"{", b"[")) else data
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 180.0) -> float:
        while time.monotonic() - self.started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.tail()}")
            with contextlib.suppress(OSError):
                if self.request("GET", "/v2/health/ready")[0] == 200:
                    return time.monotonic() - self.started
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {timeout}s: {self.tail()}")

    def status(self) -> dict[str, Any]:
        from service.cli import ctl_request

        return ctl_request(self.control, {"cmd": "status"}, 10)

    def tail(self, n: int = 1500) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == name:
                    out.append(record)
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.log.close()


# -- load generator (raw HTTP/1.1 keep-alive, in client processes) ---------------------------------
async def _read_answer(reader: asyncio.StreamReader) -> int:
    status = int((await reader.readline()).split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


async def _connection(port: int, bodies: list[bytes], first: int, step: int, stop_at: float,
                      stats: dict[str, Any]) -> None:  # fmt: skip
    i = first
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while time.monotonic() < stop_at:
        body = bodies[i % len(bodies)]
        i += step
        head = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
        t0 = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert reader is not None
            writer.write(head + body)
            status = await _read_answer(reader)
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
            stats["errors"][type(exc).__name__] = stats["errors"].get(type(exc).__name__, 0) + 1
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.05)
            continue
        if time.monotonic() > stop_at:
            break  # answered after the window: not counted, so req/s is not inflated
        key = str(status)
        stats["codes"][key] = stats["codes"].get(key, 0) + 1
        if len(stats["lat"]) < 200_000:
            stats["lat"].append((time.perf_counter() - t0) * 1000)
    if writer is not None:
        writer.close()


def _client_process(port: int, texts: list[str], first: int, step: int, conns: int,
                    seconds: float, queue: Any) -> None:  # fmt: skip
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    stats: dict[str, Any] = {"codes": {}, "errors": {}, "lat": []}
    stop_at = time.monotonic() + seconds

    async def main() -> None:
        await asyncio.gather(*(
            _connection(port, bodies, first + k * step, step * conns, stop_at, stats)
            for k in range(conns)
        ))  # fmt: skip

    asyncio.run(main())
    queue.put(stats)


def load(port: int, texts: list[str], concurrency: int, seconds: float,
         on_tick: Callable[[], None] | None = None, procs: int = 0) -> dict[str, Any]:  # fmt: skip
    """`concurrency` keep-alive connections posting single texts for `seconds`."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # never fork a process that holds CUDA
    procs = procs or max(1, min(6, concurrency // 8 or 1))
    queue = ctx.Queue()
    per = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    workers = [
        ctx.Process(target=_client_process, args=(port, texts, i, procs, n, seconds, queue))
        for i, n in enumerate(per) if n
    ]  # fmt: skip
    t0 = time.monotonic()
    for w in workers:
        w.start()
    results: list[dict[str, Any]] = []
    while len(results) < len(workers):
        with contextlib.suppress(Exception):
            results.append(queue.get(timeout=1.0))
        if on_tick is not None:
            on_tick()
        if time.monotonic() - t0 > seconds + 120:
            raise RuntimeError("load clients did not finish")
    for w in workers:
        w.join(10)
    wall = time.monotonic() - t0
    codes: dict[str, int] = {}
    errors: dict[str, int] = {}
    lat: list[float] = []
    for r in results:
        for k, v in r["codes"].items():
            codes[k] = codes.get(k, 0) + v
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
        lat += r["lat"]
    lat.sort()
    ok = codes.get("200", 0)
    return {
        "ok": ok,
        "failed": sum(codes.values()) - ok + sum(errors.values()),
        "codes": codes,
        "errors": errors,
        "rps": ok / max(1e-9, min(wall, seconds)),
        "p50_ms": lat[len(lat) // 2] if lat else 0.0,
        "p99_ms": lat[int(len(lat) * 0.99)] if lat else 0.0,
    }


# -- server checks ---------------------------------------------------------------------------------
def check_served(table: Table, srv: Server, model_dir: str, texts: list[str]) -> None:
    import numpy as np

    from workers.artifact import reference_logits
    from workers.runtime import softmax

    want = softmax(reference_logits(model_dir, texts))
    got = []
    for i in range(0, len(texts), 64):
        status, body = srv.request("POST", "/v1/classify", {"texts": texts[i : i + 64]})
        if status != 200:
            raise RuntimeError(f"classify answered {status}: {body!r:.200}")
        got += [r["scores"] for r in body["results"]]
    diff = np.abs(np.asarray(got, dtype=np.float32) - want)
    flips = int((np.asarray(got).argmax(1) != want.argmax(1)).sum())
    table.add("served", "CUDA vs CPU reference max abs diff", float(diff.max()),
              f"{len(texts)} texts, argmax differs on {flips}")  # fmt: skip


def check_throughput(args: argparse.Namespace, table: Table, srv: Server, texts: list[str]) -> None:
    for conc in (1, 32, 256):
        r = load(srv.port, texts, conc, args.load_s)
        table.add(
            "throughput",
            f"concurrency {conc}",
            f"{r['rps']:.0f} req/s",
            f"p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms failed {r['failed']}",
        )
        table.data[f"load_c{conc}"] = {k: v for k, v in r.items()}


def check_memory(args: argparse.Namespace, table: Table, srv: Server, texts: list[str]) -> None:
    from workers import nvml

    reader = nvml.Nvml()
    handle = reader.handle(int(args.device.split(":")[1]) if ":" in args.device else 0)
    before = reader.sample(handle)
    samples: list[int] = []

    def tick() -> None:
        s = reader.sample(handle)
        if s is not None:
            samples.append(s.mem_used)

    r = load(srv.port, texts, 64, args.soak_s, on_tick=tick)
    after = reader.sample(handle)
    if before is None or after is None or not samples:
        table.add("memory", "NVML", "no reading", reader.error or "no GPU handle")
    else:
        swing = (max(samples) - min(samples)) / max(1, min(samples)) * 100
        drift = (after.mem_used - before.mem_used) / max(1, before.mem_used) * 100
        table.add(
            "memory",
            "GPU used before / after load",
            f"{before.mem_used / 2**20:.0f} / {after.mem_used / 2**20:.0f} MiB",
            f"change {drift:+.2f}%, swing during {swing:.2f}% over {len(samples)} samples",
        )
    table.add("memory", f"soak {args.soak_s:.0f}s at concurrency 64", f"{r['rps']:.0f} req/s",
              f"failed {r['failed']}")  # fmt: skip
    status, stats = srv.request("GET", "/v1/stats")
    gpus = stats.get("gpus") if status == 200 and isinstance(stats, dict) else None
    table.add("memory", "/v1/stats gpus", json.dumps(gpus)[:150] if gpus else "none", "")


def check_forced_oom(args: argparse.Namespace, table: Table, model_dir: str,
                     texts: list[str]) -> None:  # fmt: skip
    env = {"RINGSERVE_TEST_INJECT_OOM": str(args.oom_batches)}
    srv = Server(args, model_dir, env, "oom")
    try:
        srv.wait_ready()
        states: list[str] = []

        def tick() -> None:
            with contextlib.suppress(OSError, ValueError):
                states.extend(w["state"] for w in srv.status()["workers"])

        r = load(srv.port, texts, 32, max(args.load_s, 8.0), on_tick=tick)
        tick()
        degraded = srv.events("worker_degraded")
        recovered = srv.events("worker_recovered")
        table.add("forced OOM", "failed requests", r["failed"],
                  f"{r['ok']} ok; injected {args.oom_batches} per worker")  # fmt: skip
        table.add("forced OOM", "degraded -> ready",
                  f"{len(degraded)} -> {len(recovered)} workers",
                  f"states seen {sorted(set(states))}; now {states[-1:]}")  # fmt: skip
    finally:
        srv.stop()


# -- main ------------------------------------------------------------------------------------------
def environment(table: Table, device: str) -> None:
    import torch

    from workers import nvml

    table.add("env", "torch", torch.__version__, f"python {sys.version.split()[0]}")
    if device != "fake-gpu":
        table.add("env", "GPU", torch.cuda.get_device_name(torch.device(device)),
                  f"CUDA {torch.version.cuda}")  # fmt: skip
    reader = nvml.Nvml()
    sample = reader.sample(reader.handle(0))
    table.add("env", "NVML", "ok" if sample else "none",
              f"{sample}" if sample else reader.error)  # fmt: skip


def run(args: argparse.Namespace) -> Table:
    table = Table(args.budget_s)
    environment(table, args.device)
    model_dir = artifact_dir(args, table)
    base = read_texts(args.texts)
    texts = make_texts(base, 96 if args.quick else 384)
    load_texts = base[:2000]
    items = tokenize(model_dir, texts)
    on_cuda = args.device != "fake-gpu"
    fp32 = None
    with table.section("graphs", 30) as go:
        if go and "graphs" in args.only:
            fp32 = check_graphs(args, table, model_dir, items)
    with table.section("precision", 40) as go:
        if go and fp32 is not None and "precision" in args.only:
            check_precision(args, table, model_dir, items, fp32)
    fp32 = None
    if on_cuda:
        import torch

        torch.cuda.empty_cache()
    with table.section("server", 3 * args.load_s + args.soak_s + 40) as go:
        if go and "server" in args.only:
            srv = Server(args, model_dir, {}, "main")
            try:
                table.add("server", "ready after", f"{srv.wait_ready():.1f}s",
                          f"{args.workers_per_gpu} workers on the GPU, no spare")  # fmt: skip
                for ev in srv.events("cuda_graphs")[:4]:
                    table.add("server", f"worker {ev.get('serial')} graphs", ev.get("graphs"),
                              f"{ev.get('graph_bytes', 0) / 2**20:.1f} MiB, "
                              f"warm {ev.get('warm_s')}s")  # fmt: skip
                with table.section("served"):
                    check_served(table, srv, model_dir, texts[: 64 if args.quick else 256])
                with table.section("throughput", 3 * args.load_s):
                    check_throughput(args, table, srv, load_texts)
                with table.section("memory", args.soak_s):
                    check_memory(args, table, srv, load_texts)
            finally:
                srv.stop()
    with table.section("forced OOM", 40) as go:
        if go and "oom" in args.only:
            check_forced_oom(args, table, model_dir, load_texts)
    with table.section("real OOM", 30) as go:
        if go and on_cuda and "realoom" in args.only:
            check_real_oom(args, table, model_dir)
        elif go and "realoom" in args.only:
            table.add("real OOM", "skipped", "-", "needs CUDA")
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pack:
        pack(args.pack)
        return 0
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    table = run(args)
    print("\n" + table.render())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.txt").write_text(table.render() + "\n")
        record = {"rows": table.rows, **table.data}
        (out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str))
    return 1 if any(r[1] == "FAILED" for r in table.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
