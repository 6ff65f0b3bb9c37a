"""What tracing costs: the same closed-loop load against today's code (a baseline checkout,
`--baseline DIR`), this code with tracing off, and this code tracing every request
(OTEL_TRACES_SAMPLER=always_on) into a real OTLP/HTTP receiver (devkit/otlp.py) in this
process.

The servers are started together and loaded one at a time, in an order that turns each round,
so a shared machine's drift touches each alike; each round's ratios are paired.

    git worktree add /tmp/rs-base <commit>   # today's code, e.g. the branch's base
    python -m benchmarks.tracing --baseline /tmp/rs-base [--rounds 3] [--duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from devkit.http import classify_request
from devkit.launcher import SST2, Launched, load_texts
from devkit.load import run_load
from devkit.otlp import Receiver


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, default=None, help="checkout of today's code")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per server per round")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    requests = [classify_request(t) for t in load_texts(SST2, 2000)]
    receiver = Receiver()
    base = ["--workers", str(args.workers), "--spares", "0", "--log-level", "warning"]
    plans: list[tuple[str, list[str], dict[str, str], Path | None]] = []
    if args.baseline is not None:
        plans.append(("today", base, {}, args.baseline))
    plans.append(("off", base, {}, None))
    on_env = {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_MAX_QUEUE_SIZE": "65536"}
    plans.append(("on", [*base, "--otlp-endpoint", receiver.url], on_env, None))
    rates: dict[str, list[float]] = {name: [] for name, *_ in plans}
    with tempfile.TemporaryDirectory(prefix="ringserve-trace-") as tmp:
        servers = {
            name: Launched(Path(tmp), a, env=e, binary=False, tree=tree)
            for name, a, e, tree in plans
        }
        try:
            for srv in servers.values():
                srv.wait_ready(args.workers)
                asyncio.run(run_load(srv.port, requests, args.concurrency, 3, warmup_s=0))
            names = list(servers)
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    spans0 = len(receiver.all())
                    res = asyncio.run(
                        run_load(servers[name].port, requests, args.concurrency, args.duration)
                    )
                    rates[name].append(res.rps)
                    spans = len(receiver.all()) - spans0
                    print(
                        f"round {r + 1} {name:>5}: {res.rps:7.1f} req/s, p99 {res.pct(99):6.1f} ms,"
                        f" failed {res.failed}"
                        + (f", spans received {spans}" if name == "on" else ""),
                        flush=True,
                    )
        finally:
            for srv in servers.values():
                srv.terminate()
            receiver.close()
    report(rates, args)
    return 0


def paired(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def report(rates: dict[str, list[float]], args: argparse.Namespace) -> None:
    print(
        f"\nmachine: {os.cpu_count()} CPUs; {args.workers} workers, c={args.concurrency}, "
        f"{args.rounds} rounds x {args.duration:g} s; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    for name, xs in rates.items():
        each = ", ".join(f"{x:.1f}" for x in xs)
        print(f"{name:>6}: median {statistics.median(xs):7.1f} req/s  ({each})")
    if "today" in rates:
        print(f"tracing off / today: {paired(rates['off'], rates['today']):.3f} (paired median)")
    print(f"tracing on (100%) / off: {paired(rates['on'], rates['off']):.3f} (paired median)")


if __name__ == "__main__":
    sys.exit(main())
