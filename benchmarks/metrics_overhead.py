"""What metrics collection costs: the same load against `--metrics 1` and `--metrics 0`.

Both servers run side by side on this machine. By default each round loads both at once with the
same client load, so whatever else the machine is doing hits both alike (`--mode turns` loads
them one after the other, A B then B A). Each reports texts per second and the front-end's CPU
time per text (metrics are counted in the front-end only), and the in-process cost of the
per-text hook is measured last.

    python -m benchmarks.metrics_overhead [--rounds 3] [--duration 15] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "data" / "sst2" / "sample.tsv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    metrics: int
    args: list[str]
    tmp: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    throughput: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "service.cli", "serve",
            "--port", str(self.port), "--binary-port", "0",
            "--control", str(self.tmp / f"ctl-{self.port}.sock"),
            "--metrics", str(self.metrics), "--log-level", "warning", *self.args,
        ]  # fmt: skip
        log = open(self.tmp / f"server-{self.port}.log", "wb")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}/v2/health/ready"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise SystemExit(f"server --metrics {self.metrics} exited; see {self.tmp}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"server --metrics {self.metrics} not ready within {timeout}s")

    def cpu_s(self) -> float:
        assert self.proc is not None
        t = psutil.Process(self.proc.pid).cpu_times()
        return float(t.user + t.system)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def client(port: int, bodies: list[bytes], stop_at: float, start: int) -> tuple[int, int]:
    """One keep-alive connection posting /v1/classify until stop_at; returns (ok, errors)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    ok = errors = 0
    i = start
    try:
        while time.monotonic() < stop_at:
            body = bodies[i % len(bodies)]
            i += 1
            writer.write(
                b"POST /v1/classify HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            if head.startswith(b"HTTP/1.1 200"):
                ok += 1
            else:
                errors += 1
    finally:
        writer.close()
    return ok, errors


async def load(port: int, bodies: list[bytes], seconds: float, concurrency: int) -> tuple[int, int]:
    stop_at = time.monotonic() + seconds
    results = await asyncio.gather(
        *(client(port, bodies, stop_at, k * 997) for k in range(concurrency))
    )
    return sum(r[0] for r in results), sum(r[1] for r in results)


def run_round(servers: list[Server], bodies: list[bytes], args: argparse.Namespace) -> None:
    """Load the given servers for one turn (together when there are two) and record each."""

    async def together() -> list[tuple[int, int]]:
        return list(
            await asyncio.gather(
                *(load(s.port, bodies, args.duration, args.concurrency) for s in servers)
            )
        )

    cpu0, t0 = [s.cpu_s() for s in servers], time.monotonic()
    results = asyncio.run(together())
    elapsed = time.monotonic() - t0
    for srv, c0, (ok, errors) in zip(servers, cpu0, results, strict=True):
        done = ok * args.texts
        srv.throughput.append(done / elapsed)
        srv.cpu_us.append((srv.cpu_s() - c0) / done * 1e6 if done else float("nan"))
        print(
            f"  --metrics {srv.metrics}: {done / elapsed:8.1f} texts/s, front-end "
            f"{srv.cpu_us[-1]:6.1f} us CPU/text, {errors} errors",
            flush=True,
        )


def observe_cost_us(samples: int = 200_000) -> float:
    """In-process cost of the per-text hook (Stats.observe), net of the loop around it."""
    import random

    from service.dispatcher import Result
    from service.stats import Stats

    stats = Stats((64, 128, 256))
    rng = random.Random(1)
    results = [
        Result(0, 1, None, rng.randrange(3), rng.randrange(50, 5000), rng.randrange(5000, 10**6))
        for _ in range(1000)
    ]
    latencies = [rng.randrange(10**6, 10**9) for _ in range(1000)]
    pairs = list(zip(results, latencies, strict=True))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(samples // 1000):
            for r, lat in pairs:
                stats.observe(None, r, lat)  # type: ignore[arg-type]
        t1 = time.perf_counter()
        for _ in range(samples // 1000):
            for _r, _lat in pairs:  # the same loop, empty: its cost is subtracted
                pass
        t2 = time.perf_counter()
        best = min(best, ((t1 - t0) - (t2 - t1)) / samples * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="measured turns per server")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per turn")
    p.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds per server")
    p.add_argument("--concurrency", type=int, default=16, help="client connections")
    p.add_argument("--texts", type=int, default=1, help="texts per request")
    p.add_argument("--workers", type=int, default=None, help="serving workers per server")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="TSV of texts (first column)")
    p.add_argument(
        "--aa", action="store_true", help="both servers --metrics 0: shows the noise floor"
    )
    p.add_argument(
        "--mode",
        choices=["together", "turns"],
        default="together",
        help="load both servers at once (a shared machine's noise hits both alike) or in turns",
    )
    args = p.parse_args(argv)
    rows = Path(args.data).read_text(encoding="utf-8").splitlines()[1:2001]
    texts = [r.split("\t")[0] for r in rows if r.strip()]
    bodies = [
        json.dumps(
            {"text": texts[i]}
            if args.texts == 1
            else {"texts": [texts[(i + k) % len(texts)] for k in range(args.texts)]}
        ).encode()
        for i in range(len(texts))
    ]
    extra = ["--spares", "0"] + (["--workers", str(args.workers)] if args.workers else [])
    with tempfile.TemporaryDirectory(prefix="ringserve-bench-") as tmp:
        servers = [Server(0 if args.aa else 1, extra, Path(tmp)), Server(0, extra, Path(tmp))]
        try:
            for s in servers:
                s.start()
            for s in servers:
                s.wait_ready()
                asyncio.run(load(s.port, bodies, args.warmup, args.concurrency))
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", flush=True)
                if args.mode == "together":
                    run_round(servers if r % 2 == 0 else servers[::-1], bodies, args)
                else:
                    for s in servers if r % 2 == 0 else servers[::-1]:
                        run_round([s], bodies, args)
        finally:
            for s in servers:
                s.stop()
    report(servers, args)
    return 0


def paired(on: list[float], off: list[float]) -> float:
    """Median over rounds of the on/off difference (%): each round's pair saw the same noise."""
    return statistics.median((a - b) / b * 100 for a, b in zip(on, off, strict=True))


def report(servers: list[Server], args: argparse.Namespace) -> None:
    on, off = servers
    tp_on, tp_off = statistics.median(on.throughput), statistics.median(off.throughput)
    cpu_on, cpu_off = statistics.median(on.cpu_us), statistics.median(off.cpu_us)
    label_on = "metrics off (A/A)" if args.aa else "metrics on"
    print(
        f"\nmachine: {os.cpu_count()} CPUs; {args.concurrency} connections per server, "
        f"{args.texts} text(s) a request, {args.rounds} x {args.duration:g} s, mode {args.mode}"
    )
    print(f"{'':18}{'texts/s (median)':>18}{'front-end us/text':>20}")
    print(f"{label_on:18}{tp_on:18.1f}{cpu_on:20.1f}")
    print(f"{'metrics off':18}{tp_off:18.1f}{cpu_off:20.1f}")
    tp_diff = paired(on.throughput, off.throughput)
    print(f"throughput difference, paired median over rounds: {tp_diff:+.2f}%")
    print(f"front-end CPU/text difference, paired median: {paired(on.cpu_us, off.cpu_us):+.2f}%")
    cost = observe_cost_us()
    print(
        f"per-text collection cost (Stats.observe, in-process): {cost:.2f} us, "
        f"{cost / cpu_off * 100:.2f}% of the front-end's CPU per text"
    )


if __name__ == "__main__":
    sys.exit(main())
