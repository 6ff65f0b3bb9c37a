"""Overload: far more concurrent requests than --max-queue admits. Each gets 200 or 503 with
Retry-After at once (none hangs, none is lost, none gets 500), and the admitted ones keep the
latency of a bounded queue instead of the latency of everything offered."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable

from devkit.http import HttpConn
from devkit.server import ServerProc

MAX_QUEUE = 16
CLIENTS = 200
REQUESTS_EACH = 5
HANG_S = 60.0  # an answer later than this counts as a hang


async def one_client(
    port: int, texts: list[str], index: int, connected: list[int], start: asyncio.Event
) -> list[tuple[str, float]]:
    """REQUESTS_EACH requests back to back on one keep-alive connection: (outcome, seconds)."""
    conn = await HttpConn.open(port)
    connected[0] += 1
    if connected[0] == CLIENTS:
        start.set()
    await start.wait()  # every client connected: the burst begins at once
    out = []
    for k in range(REQUESTS_EACH):
        body = json.dumps({"text": texts[(index * REQUESTS_EACH + k) % len(texts)]}).encode()
        t0 = time.monotonic()
        try:
            answer = await asyncio.wait_for(conn.call("POST", "/v1/classify", body), HANG_S)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            out.append((f"error:{type(exc).__name__}", time.monotonic() - t0))
            conn = await HttpConn.open(port)
            continue
        outcome = str(answer.status)
        if answer.status == 503 and answer.headers.get(b"retry-after") != b"1":
            outcome = "503-without-retry-after"
        elif answer.status == 200 and "label" not in json.loads(answer.body):
            outcome = "200-bad-body"
        out.append((outcome, time.monotonic() - t0))
        if conn.closed:
            conn = await HttpConn.open(port)
    conn.close()
    return out


async def burst(port: int, texts: list[str]) -> list[tuple[str, float]]:
    start = asyncio.Event()
    connected = [0]
    results = await asyncio.gather(
        *(one_client(port, texts, i, connected, start) for i in range(CLIENTS))
    )
    return [r for client in results for r in client]


async def baseline(port: int, texts: list[str], n: int = 20) -> float:
    """Median latency of requests sent one at a time to an idle server."""
    conn = await HttpConn.open(port)
    times = []
    for i in range(n):
        t0 = time.monotonic()
        answer = await conn.call("POST", "/v1/classify", json.dumps({"text": texts[i]}).encode())
        assert answer.status == 200
        times.append(time.monotonic() - t0)
    conn.close()
    return statistics.median(times)


def test_overload_answers_every_request_with_200_or_503(
    start_server: Callable[..., ServerProc], sst2_texts: list[str]
) -> None:
    srv = start_server("--workers", "1", "--spares", "0", "--max-queue", str(MAX_QUEUE))
    pids = srv.worker_pids()
    idle = asyncio.run(baseline(srv.port, sst2_texts))
    outcomes = asyncio.run(burst(srv.port, sst2_texts))

    codes = Counter(o for o, _ in outcomes)
    assert len(outcomes) == CLIENTS * REQUESTS_EACH  # none lost
    assert set(codes) <= {"200", "503"}, codes  # none hung, none 500, every 503 with Retry-After
    assert codes["200"] >= MAX_QUEUE and codes["503"] >= CLIENTS, codes  # overload was real

    admitted = sorted(t for o, t in outcomes if o == "200")
    refused = sorted(t for o, t in outcomes if o == "503")
    median = statistics.median(admitted)
    # a bounded queue keeps an admitted request behind at most MAX_QUEUE others; with the whole
    # burst queued (1,000 requests) the median would be about 30 times the baseline
    assert median < max(8 * idle, idle + 1.0), (median, idle, codes)
    assert statistics.median(refused) < max(8 * idle, 0.5), statistics.median(refused)

    assert srv.status()["queue_depth"] == 0
    assert srv.worker_pids() == pids
    print(
        f"\noverload: {dict(codes)}; idle median {idle * 1000:.1f} ms; admitted median "
        f"{median * 1000:.1f} ms, p99 {admitted[int(0.99 * len(admitted))] * 1000:.1f} ms; "
        f"refused median {statistics.median(refused) * 1000:.1f} ms"
    )
