"""Requests per second and P50/P99 latency for the same texts over every protocol ringserve speaks.

One run measures /v1/classify, KServe v2 with JSON tensors, KServe v2 with binary tensors, and the
framed binary protocol, each at concurrency 1 and 32, one SST-2 sentence per request, against a
server it starts itself (or --url/--binary-port of a running one), and prints a table.

The client is one asyncio (uvloop) process, closed loop: each of `concurrency` tasks sends its
next request when the last answer is in. Requests are encoded before the clock starts and
answers are framed (Content-Length, or the binary answer's length) but not decoded, so the client
costs little CPU on a machine it shares with the server; its CPU share is printed with each cell,
and so is the server front-end's CPU time per request (what the protocol itself costs there).
HTTP tasks each own a keep-alive connection; binary-protocol tasks share one connection, as that
protocol is meant to be used (pipelined, answers matched by tag).

    python -m benchmarks.protocols [--duration 10] [--max-requests 4000] [--concurrency 1,32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psutil

ROOT = Path(__file__).resolve().parent.parent
SST2 = ROOT / "data" / "sst2" / "sample.tsv"
ANSWER = struct.Struct("<QBBHH")
PROTOCOLS = ("http", "kserve-json", "kserve-binary", "binary")
IDLE_S = 3.0  # how long the idle front-end's own CPU use is measured before the cells


# -- requests, encoded before the clock starts ----------------------------------------------------
def http_post(path: str, body: bytes, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: bench", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def encode_requests(protocol: str, texts: list[str], model: str) -> list[bytes]:
    infer = f"/v2/models/{model}/infer"
    out = []
    for text in texts:
        data = text.encode()
        spec: dict[str, object] = {"name": "text", "datatype": "BYTES", "shape": [1]}
        if protocol == "http":
            out.append(http_post("/v1/classify", json.dumps({"text": text}).encode()))
        elif protocol == "kserve-json":
            spec["data"] = [text]
            out.append(http_post(infer, json.dumps({"inputs": [spec]}).encode()))
        elif protocol == "kserve-binary":
            blob = struct.pack("<I", len(data)) + data
            spec["parameters"] = {"binary_data_size": len(blob)}
            doc = {"inputs": [spec], "parameters": {"binary_data_output": True}}
            head = json.dumps(doc).encode()
            out.append(
                http_post(infer, head + blob, Inference_Header_Content_Length=str(len(head)))
            )
        else:
            out.append(struct.pack("<I", len(data)) + data)  # the tag is added per send
    return out


# -- clients --------------------------------------------------------------------------------------
class HttpConnection(asyncio.Protocol):
    """One keep-alive connection, one request at a time; answers framed by Content-Length."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        lines = bytes(self.buffer[:end]).split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) >= end + 4 + length:
            del self.buffer[: end + 4 + length]
            self.waiter.set_result(int(lines[0].split()[1]))
            self.waiter = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionError("closed"))

    async def request(self, data: bytes) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return await self.waiter


class BinaryConnection(asyncio.Protocol):
    """One connection shared by every task; answers matched to their futures by tag."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.pending: dict[int, asyncio.Future[int]] = {}
        self.tags = itertools.count(1)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos = 0
        while len(buf) - pos >= ANSWER.size:
            tag, status, _, _, n = ANSWER.unpack_from(buf, pos)
            if len(buf) - pos < ANSWER.size + 4 * n:
                break
            pos += ANSWER.size + 4 * n
            self.pending.pop(tag).set_result(200 if status == 0 else 500 + status)
        del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(exc or ConnectionError("closed"))

    async def request(self, frame: bytes) -> int:
        tag = next(self.tags)
        future = asyncio.get_running_loop().create_future()
        self.pending[tag] = future
        assert self.transport is not None
        self.transport.write(frame + struct.pack("<Q", tag))
        return await future


# -- one cell of the table ------------------------------------------------------------------------
@dataclass
class Cell:
    protocol: str
    concurrency: int
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    client_cpu_s: float = 0.0
    frontend_cpu_s: float | None = None  # the server's front-end process, when we know its pid

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")

    def row(self) -> str:
        n = len(self.latencies_ms)
        rps = n / self.seconds if self.seconds else 0.0
        cpu = 100 * self.client_cpu_s / self.seconds if self.seconds else 0.0
        front = "-"
        if self.frontend_cpu_s is not None and n:
            front = f"{self.frontend_cpu_s / n * 1e6:.0f}"
        return (
            f"| {self.protocol} | {self.concurrency} | {n} | {rps:.1f} | {self.pct(50):.1f} "
            f"| {self.pct(99):.1f} | {self.errors} | {cpu:.1f}% | {front} |"
        )


async def run_cell(
    cell: Cell,
    host: str,
    port: int,
    requests: list[bytes],
    duration: float,
    limit: int,
    pid: int | None,
) -> None:
    loop = asyncio.get_running_loop()
    if cell.protocol == "binary":
        _, shared = await loop.create_connection(BinaryConnection, host, port)
        senders: list[Callable[[bytes], Awaitable[int]]] = [shared.request] * cell.concurrency
    else:
        senders = []
        for _ in range(cell.concurrency):
            _, conn = await loop.create_connection(HttpConnection, host, port)
            senders.append(conn.request)
    texts = itertools.cycle(requests)
    for send in senders:  # warm: one untimed request per connection slot
        await send(next(texts))
    stop_at = time.perf_counter() + duration
    started = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    front0 = process_cpu(pid)

    async def worker(send: Callable[[bytes], Awaitable[int]]) -> None:
        while time.perf_counter() < stop_at and len(cell.latencies_ms) + cell.errors < limit:
            t0 = time.perf_counter()
            code = await send(next(texts))
            if code == 200:
                cell.latencies_ms.append((time.perf_counter() - t0) * 1000)
            else:
                cell.errors += 1

    await asyncio.gather(*(worker(s) for s in senders))
    cell.seconds = time.perf_counter() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    front1 = process_cpu(pid)
    if front0 is not None and front1 is not None:
        cell.frontend_cpu_s = front1 - front0
    cell.client_cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if cell.protocol == "binary":
        assert shared.transport is not None
        shared.transport.close()


# -- the server -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url + "/v2/health/ready", timeout=5) as resp,
        ):
            if resp.status == 200:
                return
        time.sleep(0.2)
    raise SystemExit("server not ready in time")


def start_server(args: list[str], tmp: str) -> tuple[subprocess.Popen[bytes], str, int]:
    port, binary_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
    cmd += ["--binary-port", str(binary_port), "--control", os.path.join(tmp, "ctl.sock"), *args]
    log = open(os.path.join(tmp, "server.log"), "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", binary_port


def load_texts(path: Path, count: int) -> list[str]:
    rows = path.read_text(encoding="utf-8").splitlines()[1:]
    return [r.split("\t")[0] for r in rows[:count]]


def process_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def measure(
    args: argparse.Namespace, url: str, binary_port: int, pid: int | None
) -> list[Cell]:
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80
    with urllib.request.urlopen(url + "/v1/model", timeout=10) as resp:
        model = json.loads(resp.read())["name"]
    texts = load_texts(Path(args.data), args.texts)
    idle_rate = 0.0
    before = process_cpu(pid)
    if before is not None:  # supervisor ticks, heartbeats, sweeps: not the protocols' cost
        await asyncio.sleep(IDLE_S)
        idle_rate = (process_cpu(pid) or before) - before
        idle_rate /= IDLE_S
    cells = []
    for protocol in args.protocols.split(","):
        requests = encode_requests(protocol, texts, model)
        target = binary_port if protocol == "binary" else port
        for conc in (int(c) for c in args.concurrency.split(",")):
            cell = Cell(protocol, conc)
            await run_cell(cell, host, target, requests, args.duration, args.max_requests, pid)
            if cell.frontend_cpu_s is not None:  # less what the idle front-end spends anyway
                cell.frontend_cpu_s = max(0.0, cell.frontend_cpu_s - idle_rate * cell.seconds)
            print(cell.row(), flush=True)
            cells.append(cell)
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server's HTTP base URL (default: start one)")
    parser.add_argument("--binary-port", type=int, default=8001, help="with --url")
    parser.add_argument("--server-pid", type=int, help="with --url: front-end pid, for its CPU")
    parser.add_argument("--server-args", default="--workers 2 --spares 0", help="when started")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per cell at most")
    parser.add_argument("--max-requests", type=int, default=4000, help="per cell at most")
    parser.add_argument("--data", default=str(SST2), help="TSV with the texts in column one")
    parser.add_argument("--texts", type=int, default=1000, help="distinct texts, cycled")
    args = parser.parse_args(argv)

    import uvloop

    proc = None
    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmp:
        if args.url:
            url, binary_port = args.url.rstrip("/"), args.binary_port
        else:
            proc, url, binary_port = start_server(args.server_args.split(), tmp)
        try:
            wait_ready(url, proc)
            print(f"server: {url} ({args.server_args if proc else 'external'}), one text a request")
            print(
                "| protocol | conc | requests | req/s | p50 ms | p99 ms | errors | client CPU "
                "| front-end CPU us/req |"  # the idle front-end's share subtracted
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            pid = proc.pid if proc is not None else args.server_pid
            uvloop.run(measure(args, url, binary_port, pid))
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
