"""Keys with rates and priorities under load, open loop, in one run.

`rate`: a key limited to 50 requests/s (burst 10) is offered 200 requests/s for 20 s while
another key sends 20 requests/s; the limited key should get about 50/s answered 200 and the
rest 429, the other key all 200, with the latency it has alone (measured first, same run).

`priority`: the server's capacity is measured (closed loop, single texts); then interactive
requests at 10% of it on the idle server; then the same interactive load while a bulk key
offers 5x capacity (requests of 8 texts); then, for comparison, the same again with the bulk
key's traffic sent as interactive (what a single first-in-first-out queue gives). Reported:
the interactive P99s and their ratio, and the latency of every admitted bulk text against
the bound (--bulk-max-wait-ms + --max-queue-ms, docs/design.md).

    python -m benchmarks.tenants [rate] [priority] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devkit.http import HttpConn, http_message
from devkit.launcher import SST2, Launched, load_texts
from devkit.load import percentile, run_load

LIMITED, OTHER, BULK, INTER = (
    f"rs-bench-{n}-5d2c8e1f" for n in ("limited", "other", "bulk", "inter")
)
BULK_WAIT_MS, MAX_QUEUE_MS = 2000.0, 1000.0  # the server's defaults, spelled out


@dataclass
class Outcome:
    """Each request's status and latency (ms, from its scheduled send: open loop)."""

    statuses: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # of the 200s

    def count(self, code: int) -> int:
        return self.statuses.count(code)

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)


class Pool:
    """Keep-alive connections, one per request in flight, reused."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[HttpConn] = []

    async def send(self, request: bytes) -> int:
        conn = self.idle.pop() if self.idle else await HttpConn.open(self.port)
        try:
            answer = await conn.send(request)
        except (OSError, asyncio.IncompleteReadError):
            conn.close()
            return 0
        if not conn.closed:
            self.idle.append(conn)
        return answer.status

    def close(self) -> None:
        for c in self.idle:
            c.close()


def request(key: str, texts: list[str]) -> bytes:
    doc = {"text": texts[0]} if len(texts) == 1 else {"texts": texts}
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    return http_message("POST", "/v1/classify", json.dumps(doc).encode(), headers)


async def open_loop(port: int, requests: list[bytes], rate: float, seconds: float) -> Outcome:
    """Send at `rate` whatever the answers do; each latency counts from its scheduled time."""
    pool, out = Pool(port), Outcome()
    t0 = time.monotonic()
    tasks = []

    async def one(k: int, at: float) -> None:
        status = await pool.send(requests[k % len(requests)])
        out.statuses.append(status)
        if status == 200:
            out.latencies.append((time.monotonic() - at) * 1000)

    n = int(rate * seconds)
    for k in range(n):
        at = t0 + k / rate
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(k, at)))
    await asyncio.gather(*tasks)
    pool.close()
    return out


def keyed_server(tmp: Path, keys: str, workers: int) -> Launched:
    path = tmp / "keys.txt"
    path.write_text(keys)
    os.chmod(path, 0o600)
    args = ["--workers", str(workers), "--spares", "0", "--api-keys", str(path)]
    srv = Launched(tmp, [*args, "--log-level", "warning"], binary=False)
    srv.wait_ready(workers)
    return srv


def rate_run(texts: list[str], workers: int, seconds: float) -> None:
    keys = f"{LIMITED} tenant=limited rate=50 burst=10\n{OTHER} tenant=other\n"
    limited = [request(LIMITED, [t]) for t in texts]
    other = [request(OTHER, [t]) for t in texts]
    with tempfile.TemporaryDirectory(prefix="ringserve-rate-") as tmp:
        srv = keyed_server(Path(tmp), keys, workers)
        try:
            alone = asyncio.run(open_loop(srv.port, other, 20, 10))

            async def both() -> tuple[Outcome, Outcome]:
                a, b = await asyncio.gather(
                    open_loop(srv.port, limited, 200, seconds),
                    open_loop(srv.port, other, 20, seconds),
                )
                return a, b

            lim, oth = asyncio.run(both())
        finally:
            srv.terminate()
    print(f"\nrate: limited key rate=50 burst=10 offered 200 req/s for {seconds:g} s, open loop")
    print(
        f"  limited: {lim.count(200) / seconds:.1f}/s answered 200, "
        f"{lim.count(429) / seconds:.1f}/s 429, other statuses "
        f"{len(lim.statuses) - lim.count(200) - lim.count(429)}"
    )
    print(
        f"  other key (20 req/s): {oth.count(200)}/{len(oth.statuses)} answered 200; p50 "
        f"{oth.p(50):.1f} ms, p99 {oth.p(99):.1f} ms (alone before: p50 {alone.p(50):.1f}, "
        f"p99 {alone.p(99):.1f}, {alone.count(200)}/{len(alone.statuses)} answered 200)"
    )


def bulk_requests(texts: list[str], key: str) -> list[bytes]:
    return [request(key, texts[i : i + 8]) for i in range(0, len(texts) - 8, 8)]


def saturated(
    port: int, inter: list[bytes], bulk: list[bytes], cap: float, s: float
) -> tuple[Outcome, Outcome]:
    async def run() -> tuple[Outcome, Outcome]:
        bulk_task = asyncio.create_task(open_loop(port, bulk, 5 * cap / 8, s + 3))
        await asyncio.sleep(3)  # the bulk backlog first
        i = await open_loop(port, inter, 0.1 * cap, s)
        return i, await bulk_task

    return asyncio.run(run())


def priority_run(texts: list[str], workers: int, seconds: float) -> None:
    keys = f"{BULK} tenant=batchjob priority=bulk\n{INTER} tenant=web\n{OTHER} tenant=fifo\n"
    single = [request(INTER, [t]) for t in texts]
    with tempfile.TemporaryDirectory(prefix="ringserve-prio-") as tmp:
        srv = keyed_server(Path(tmp), keys, workers)
        try:
            cap = asyncio.run(run_load(srv.port, single, 32, 10, warmup_s=3)).rps
            idle = asyncio.run(open_loop(srv.port, single, 0.1 * cap, seconds))
            i_sat, b_sat = saturated(srv.port, single, bulk_requests(texts, BULK), cap, seconds)
            time.sleep(3)  # the bulk backlog drains
            i_fifo, b_fifo = saturated(srv.port, single, bulk_requests(texts, OTHER), cap, seconds)
        finally:
            srv.terminate()
    bound = BULK_WAIT_MS + MAX_QUEUE_MS
    print(f"\npriority: capacity {cap:.1f} texts/s (closed loop, c=32, single texts)")
    print(
        f"  interactive at {0.1 * cap:.1f} req/s, idle server: p50 {idle.p(50):.1f} ms, "
        f"p99 {idle.p(99):.1f} ms"
    )
    for name, i, b in (
        ("bulk key priority=bulk", i_sat, b_sat),
        ("same load, all interactive (FIFO)", i_fifo, b_fifo),
    ):
        other = len(i.statuses) - i.count(200)
        print(
            f"  {name}: bulk offered {5 * cap:.0f} texts/s; interactive p50 {i.p(50):.1f} ms, "
            f"p99 {i.p(99):.1f} ms = {i.p(99) / idle.p(99):.2f} x idle p99; not 200: {other}"
        )
        late = sum(1 for x in b.latencies if x > bound)
        print(
            f"    bulk requests: {b.count(200)} answered 200 (p50 {b.p(50):.0f} ms, "
            f"p99 {b.p(99):.0f} ms, max {max(b.latencies, default=0):.0f} ms), "
            f"{b.count(503)} refused 503; "
            f"{late} over the bound of {bound:.0f} ms"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="*", default=["rate", "priority"], choices=["rate", "priority"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args(argv)
    texts = load_texts(SST2, 2000)
    print(
        f"machine: {os.cpu_count()} CPUs; {args.workers} workers; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    if "rate" in args.parts:
        rate_run(texts, args.workers, args.seconds)
    if "priority" in args.parts:
        priority_run(texts, args.workers, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
