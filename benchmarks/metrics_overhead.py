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
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devkit.http import http_message
from devkit.launcher import SST2, Launched, load_texts
from devkit.load import LoadResult, run_load


@dataclass
class Server:
    """One of the two servers compared, and what was measured on it."""

    metrics: int
    args: list[str]
    tmp: Path
    srv: Launched | None = None
    throughput: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    def start(self) -> Launched:
        args = ["--metrics", str(self.metrics), "--log-level", "warning", *self.args]
        self.srv = Launched(self.tmp, args, binary=False)
        return self.srv

    @property
    def running(self) -> Launched:
        assert self.srv is not None, "start() first"
        return self.srv

    def stop(self) -> None:
        if self.srv is not None:
            self.srv.terminate()


def run_round(servers: list[Server], requests: list[bytes], args: argparse.Namespace) -> None:
    """Load the given servers for one turn (together when there are two) and record each."""

    async def together() -> list[LoadResult]:
        loads = [
            run_load(s.running.port, requests, args.concurrency, args.duration, warmup_s=0)
            for s in servers
        ]
        return list(await asyncio.gather(*loads))

    cpu0, t0 = [s.running.cpu_s() for s in servers], time.monotonic()
    results = asyncio.run(together())
    elapsed = time.monotonic() - t0
    for srv, c0, r in zip(servers, cpu0, results, strict=True):
        done = r.ok * args.texts
        srv.throughput.append(done / elapsed)
        srv.cpu_us.append((srv.running.cpu_s() - c0) / done * 1e6 if done else float("nan"))
        print(
            f"  --metrics {srv.metrics}: {done / elapsed:8.1f} texts/s, front-end "
            f"{srv.cpu_us[-1]:6.1f} us CPU/text, {r.failed} errors",
            flush=True,
        )


def observe_cost_us(samples: int = 200_000) -> float:
    """In-process cost of the per-text hook (Stats.observe), net of the loop around it."""
    import random

    from ringserve.service.engine.dispatcher import Result
    from ringserve.service.ops.stats import Stats

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
    p.add_argument("--data", default=str(SST2), help="TSV of texts (first column)")
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
    texts = load_texts(args.data, 2000)
    requests = [
        classify_json(
            {"text": texts[i]}
            if args.texts == 1
            else {"texts": [texts[(i + k) % len(texts)] for k in range(args.texts)]}
        )
        for i in range(len(texts))
    ]
    extra = ["--spares", "0"] + (["--workers", str(args.workers)] if args.workers else [])
    with tempfile.TemporaryDirectory(prefix="ringserve-bench-") as tmp:
        servers = [Server(0 if args.aa else 1, extra, Path(tmp)), Server(0, extra, Path(tmp))]
        try:
            for launched in [s.start() for s in servers]:
                launched.wait_ready()
                asyncio.run(
                    run_load(launched.port, requests, args.concurrency, args.warmup, warmup_s=0)
                )
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", flush=True)
                if args.mode == "together":
                    run_round(servers if r % 2 == 0 else servers[::-1], requests, args)
                else:
                    for s in servers if r % 2 == 0 else servers[::-1]:
                        run_round([s], requests, args)
        finally:
            for s in servers:
                s.stop()
    report(servers, args)
    return 0


def classify_json(doc: dict[str, object]) -> bytes:
    body = json.dumps(doc).encode()
    return http_message("POST", "/v1/classify", body, {"Content-Type": "application/json"})


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
