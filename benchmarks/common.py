"""What the benchmarks and the test fixtures share: a server launcher on free ports, the sample
texts, a plain HTTP client (blocking and asyncio) and one closed-loop load generator.

The load generator is lean on purpose: each of `concurrency` tasks owns one keep-alive connection
and sends its next prebuilt request as soon as the last answer is in, so the client spends little
CPU on a machine it shares with the server.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from ringserve.service.cli import ctl_request
from ringserve.service.protocols.handover import socket_is_live

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"  # small samples with provenance (data/README.md)
SST2 = DATA / "sst2" / "sample.tsv"
AG_NEWS = DATA / "ag_news" / "sample.tsv"
HOST = "127.0.0.1"  # benchmarks and tests never send traffic anywhere else


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def load_texts(path: Path | str = SST2, n: int | None = None) -> list[str]:
    """The first column of a TSV with a header row (the samples in data/, or a full set)."""
    rows = Path(path).read_text(encoding="utf-8").splitlines()[1:]
    texts = [r.split("\t")[0] for r in rows if r.strip()]
    return texts[:n] if n is not None else texts


# -- blocking HTTP --------------------------------------------------------------------------------
def http_request(
    port: int,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
    host: str = HOST,
) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: (status, headers with lower-case names, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(port: int, path: str, timeout: float = 10.0, host: str = HOST) -> dict[str, Any]:
    status, _, body = http_request(port, "GET", path, timeout=timeout, host=host)
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {body[:200]!r}")
    doc: dict[str, Any] = json.loads(body)
    return doc


def raw_runner(
    model_dir: str, runtime: str, precision: str, max_batch: int, graph: str = "plain"
) -> Any:
    """The model alone on one thread, run as a CPU worker runs it (workers/worker.py): an
    OrtRunner on the artifact's ONNX file for `precision`, or TorchScript without the profiling
    executor. For the benchmarks' ceilings; imports torch, so call it in the measuring process."""
    import torch
    from ringserve.workers.artifact import load_manifest, load_model
    from ringserve.workers.onnx_model import open_session
    from ringserve.workers.runtime import CpuRunner, OrtRunner
    from ringserve.workers.worker import set_graph_optimize

    torch.set_num_threads(1)
    m = load_manifest(model_dir)
    if runtime == "onnx":
        session = open_session(f"{model_dir}/{m.onnx_for(precision, graph)}")
        return OrtRunner(session, m.max_length, max_batch, precision=precision)
    set_graph_optimize(True)
    return CpuRunner(load_model(model_dir), m.max_length, max_batch)


def inherited_env() -> dict[str, str]:
    """This process's environment less RINGSERVE_API_KEY: a key exported in the shell must not
    turn every server under test into a keyed one (a keyed server is asked for by `env`)."""
    return {k: v for k, v in os.environ.items() if k != "RINGSERVE_API_KEY"}


# -- the server under test ------------------------------------------------------------------------
class Launched:
    """A `ringserve serve` child on free ports, its output in a log file under `tmp`."""

    def __init__(
        self,
        tmp: Path | str,
        args: list[str],
        env: dict[str, str] | None = None,
        binary: bool = True,
        port: int | None = None,
        beside: Launched | None = None,
        own_group: bool = False,
        tree: Path | None = None,
        grpc: bool = False,
    ) -> None:
        """`grpc`: serve the gRPC port too, on a free port (off unless asked: most servers
        here never use it, and none may take the default 8002 another test server holds).
        `beside`: share that server's ports and control path (a --reuse-port upgrade).
        `own_group`: start it in a session of its own, so a signal to its process group (as
        systemd, supervisord and `kill -TERM -PGID` send) reaches it and its children only.
        `tree`: run the server of another checkout (a baseline commit), not this one."""
        tmp = Path(tmp)
        self.port: int = beside.port if beside else port or free_port()
        self.binary_port: int = beside.binary_port if beside else free_port() if binary else 0
        self.grpc_port: int = beside.grpc_port if beside else free_port() if grpc else 0
        self.base_control: str = (
            beside.base_control if beside else str(tmp / f"ctl-{self.port}.sock")
        )
        self.control = self.base_control
        taken = beside is not None and socket_is_live(self.base_control)
        self.log_path = tmp / f"server-{self.port}{f'-{time.monotonic_ns()}' if beside else ''}.log"
        self.args = [
            sys.executable, "-m", "ringserve.service.cli", "serve",
            "--host", HOST, "--port", str(self.port),
            "--binary-port", str(self.binary_port),
            # another checkout (`tree`, a baseline) may predate the option: there, off unless asked
            *(["--grpc-port", str(self.grpc_port)] if tree is None or grpc else []),
            "--control", self.control,
            *args,
        ]  # fmt: skip
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.args, cwd=tree or ROOT, env={**inherited_env(), **(env or {})}, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=own_group,
        )  # fmt: skip
        self.pid = self.proc.pid
        if taken:  # its own control socket beside the live one (CONTRACT.md)
            self.control = f"{self.base_control}.{self.pid}"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def logs(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def ctl(self, cmd: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        return ctl_request(self.control, cmd, timeout)

    def ready_workers(self) -> int:
        rows = self.ctl({"cmd": "status"})["workers"]
        assert isinstance(rows, list)
        return sum(1 for w in rows if w["state"] in ("ready", "degraded"))

    def is_ready(self, workers: int | None = None) -> bool:
        if self.proc.poll() is not None:
            raise ServerExited(f"server exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
        try:
            status, _, _ = http_request(self.port, "GET", "/v2/health/ready", timeout=5)
        except OSError:
            return False
        return status == 200 and (workers is None or self.ready_workers() >= workers)

    def wait_ready(self, workers: int | None = None, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.is_ready(workers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready in {timeout} s; log:\n{self.logs()[-4000:]}")
            time.sleep(0.05)

    def cpu_s(self) -> float:
        t = psutil.Process(self.pid).cpu_times()
        return float(t.user + t.system)

    def wait_exit(self, timeout: float) -> int:
        """Wait for the server to exit by itself (a start that must fail); SIGTERM if it won't."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        return self.terminate()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; SIGKILL (and raise) if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self.log.close()


class ServerExited(Exception):
    """The server process ended while something waited for it."""


# -- asyncio HTTP ---------------------------------------------------------------------------------
@dataclass
class HttpAnswer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class HttpConn:
    """One keep-alive HTTP/1.1 connection on asyncio streams; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    @classmethod
    async def open(cls, port: int, host: str = HOST) -> HttpConn:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> HttpAnswer:
        self.writer.write(http_message(method, path, body, headers))
        return await self.read_answer()

    async def send(self, request: bytes) -> HttpAnswer:
        """A prebuilt request (http_message), written as is."""
        self.writer.write(request)
        return await self.read_answer()

    async def read_answer(self) -> HttpAnswer:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].split(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return HttpAnswer(status, headers, body)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


def http_message(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: bench", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def classify_request(text: str, path: str = "/v1/classify") -> bytes:
    body = json.dumps({"text": text}).encode()
    return http_message("POST", path, body, {"Content-Type": "application/json"})


# -- closed-loop load -----------------------------------------------------------------------------
@dataclass
class LoadResult:
    concurrency: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    codes: Counter[int] = field(default_factory=Counter)

    @property
    def ok(self) -> int:
        return self.codes.get(200, 0)

    @property
    def failed(self) -> int:
        return sum(v for c, v in self.codes.items() if c != 200)

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        return percentile(self.latencies_ms, p)

    def row(self) -> str:
        return (
            f"c={self.concurrency:<4} ok={self.ok:<6} rps={self.rps:8.1f} "
            f"p50={self.pct(50):7.1f}ms p99={self.pct(99):7.1f}ms codes={dict(self.codes)}"
        )


def percentile(xs: list[float], p: float) -> float:
    """The p-th percentile (0-100) by rank; NaN for no samples."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def _client(
    port: int, requests: list[bytes], offset: int, stop_at: float, limit: list[int], out: LoadResult
) -> None:
    conn = await HttpConn.open(port)
    i = offset
    try:
        while time.monotonic() < stop_at and limit[0] > 0:
            limit[0] -= 1
            req = requests[i % len(requests)]
            i += 1
            t0 = time.perf_counter()
            try:
                answer = await conn.send(req)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                out.codes[0] += 1  # a broken connection counts as a failed request
                conn.close()
                conn = await HttpConn.open(port)
                continue
            out.codes[answer.status] += 1
            if answer.status == 200:
                out.latencies_ms.append((time.perf_counter() - t0) * 1000)
            if conn.closed:
                conn = await HttpConn.open(port)
    finally:
        conn.close()


async def run_load(
    port: int,
    requests: list[bytes],
    concurrency: int,
    seconds: float,
    max_requests: int = 1_000_000,
    warmup_s: float = 1.0,
) -> LoadResult:
    """Closed-loop load of prebuilt requests for `seconds`, after an uncounted warm-up."""
    if warmup_s > 0:
        await run_load(port, requests, concurrency, warmup_s, max_requests, 0)
    result = LoadResult(concurrency, seconds)
    limit = [max_requests]
    t0 = time.monotonic()
    stop_at = t0 + seconds
    await asyncio.gather(
        *(_client(port, requests, k * 7919, stop_at, limit, result) for k in range(concurrency))
    )
    result.seconds = time.monotonic() - t0
    return result


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
