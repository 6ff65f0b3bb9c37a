"""Overload benchmark: capacity by a short closed-loop run, then open-loop load at 2x and 5x it.

Starts its own server on free 127.0.0.1 ports, offers Poisson arrivals on keep-alive
connections, and prints per phase: goodput (200s per second), P50/P99 latency of the admitted
requests (from each request's scheduled arrival, so a lagging client does not hide queueing) and
the share rejected with 503. Target: goodput at 5x stays at least 90% of goodput at 1x.

    python -m benchmarks.overload [--workers 1] [--max-queue 64] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from devkit.http import HOST, HttpAnswer, HttpConn
from devkit.launcher import SST2, Launched, load_texts
from devkit.load import percentile

MAX_CONNECTIONS = 900  # open-loop client connections (below the server's default cap of 1024)
REQUEST_TIMEOUT_S = 60.0  # a request unanswered this long counts as hung


def classify_body(text: str) -> bytes:
    return json.dumps({"text": text}).encode()


# -- load generators ------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    offered_per_s: float
    seconds: float
    codes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # seconds, of the 200s

    @property
    def goodput(self) -> float:
        return self.codes["200"] / self.seconds

    @property
    def total(self) -> int:
        return sum(self.codes.values())

    def percentile(self, q: float) -> float:
        return percentile(self.latencies, q * 100)

    def rejected_share(self) -> float:
        return self.codes["503"] / self.total if self.total else 0.0


def record(phase: Phase, answer: HttpAnswer, latency: float) -> None:
    key = str(answer.status)
    if answer.status == 503 and b"retry-after" not in answer.headers:
        key = "503-without-retry-after"
    phase.codes[key] += 1
    if answer.status == 200:
        phase.latencies.append(latency)


async def closed_loop(port: int, texts: list[str], clients: int, seconds: float) -> Phase:
    """`clients` connections each send back to back for `seconds`: the server's capacity."""
    phase = Phase("1x (closed loop)", 0.0, seconds)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def client(index: int) -> None:
        conn = await HttpConn.open(port)
        i = index
        while loop.time() < end:
            i += clients
            t0 = loop.time()
            answer = await conn.call("POST", "/v1/classify", classify_body(texts[i % len(texts)]))
            record(phase, answer, loop.time() - t0)
            if conn.closed:
                conn = await HttpConn.open(port)
        conn.close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    phase.offered_per_s = phase.total / seconds
    return phase


async def open_loop(
    port: int, texts: list[str], name: str, rate: float, seconds: float, seed: int = 1
) -> Phase:
    """Poisson arrivals at `rate` per second, each on an idle connection (or a new one)."""
    phase = Phase(name, rate, seconds)
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    idle: list[HttpConn] = []
    opened = 0
    tasks: set[asyncio.Task[None]] = set()

    async def one(scheduled: float, body: bytes) -> None:
        nonlocal opened
        conn: HttpConn | None = None
        if idle:
            conn = idle.pop()
        elif opened >= MAX_CONNECTIONS:
            phase.codes["client-out-of-connections"] += 1
            return
        opened += 1 if conn is None else 0
        try:
            if conn is None:
                conn = await HttpConn.open(port)
            answer = await asyncio.wait_for(
                conn.call("POST", "/v1/classify", body), REQUEST_TIMEOUT_S
            )
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            phase.codes[f"error:{type(exc).__name__}"] += 1
            if conn is not None:
                conn.close()
            opened -= 1
            return
        record(phase, answer, loop.time() - scheduled)
        if conn.closed:
            opened -= 1
        else:
            idle.append(conn)

    start = loop.time()
    due = start
    i = 0
    while True:
        due += rng.expovariate(rate)
        if due - start >= seconds:
            break
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        i += 1
        task = asyncio.create_task(one(due, classify_body(texts[i % len(texts)])))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    for conn in idle:
        conn.close()
    return phase


def report(phase: Phase) -> str:
    other = {k: v for k, v in phase.codes.items() if k not in ("200", "503")}
    return (
        f"{phase.name:<18} offered {phase.offered_per_s:8.1f}/s  goodput {phase.goodput:7.1f}/s  "
        f"p50 {phase.percentile(0.50) * 1000:7.1f} ms  "
        f"p99 {phase.percentile(0.99) * 1000:7.1f} ms  "
        f"rejected {phase.rejected_share() * 100:5.1f}%  requests {phase.total}"
        + (f"  other {dict(other)}" if other else "")
    )


async def run_phases(port: int, texts: list[str], ns: argparse.Namespace) -> list[Phase]:
    base = await closed_loop(port, texts, ns.clients, ns.capacity_seconds)
    print(report(base), flush=True)
    phases = [base]
    for factor in ns.factors:
        rate = base.goodput * factor
        phase = await open_loop(port, texts, f"{factor:g}x (open loop)", rate, ns.seconds)
        print(report(phase), flush=True)
        phases.append(phase)
    return phases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overload", description=__doc__)
    parser.add_argument("--workers", type=int, default=1, help="1 leaves a core to the client")
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients (1x)")
    parser.add_argument("--capacity-seconds", type=float, default=8.0)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each open phase")
    parser.add_argument("--factors", type=float, nargs="+", default=[2.0, 5.0])
    parser.add_argument("--texts", type=Path, default=SST2, help="TSV, text in column 1")
    parser.add_argument("--server-args", default="", help="extra `ringserve serve` options")
    ns = parser.parse_args(argv)
    texts = load_texts(ns.texts, 2000)
    with tempfile.TemporaryDirectory(prefix="ringserve-overload-") as tmp:
        args = ["--workers", str(ns.workers), "--spares", "0", "--max-queue", str(ns.max_queue)]
        srv = Launched(tmp, args + ns.server_args.split(), binary=False)
        try:
            srv.wait_ready()
            print(f"server pid {srv.pid} on {HOST}:{srv.port}: {' '.join(args)}", flush=True)
            phases = asyncio.run(run_phases(srv.port, texts, ns))
        finally:
            srv.terminate()
    base, worst = phases[0], phases[-1]
    ratio = worst.goodput / base.goodput if base.goodput else 0.0
    verdict = "meets" if ratio >= 0.9 else "misses"
    name = worst.name.split()[0]
    print(f"goodput at {name} = {ratio * 100:.1f}% of goodput at 1x ({verdict} the 90% target)")
    return 0 if ratio >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
