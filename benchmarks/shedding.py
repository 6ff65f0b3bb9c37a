"""Overload and fair share, sized from the capacity this run measures first (never a README figure).

1. capacity: closed loop, HTTP /v1/classify at c=32 (the 1x goodput);
2. overload: open loop (Poisson) at --factor x that, HTTP and binary alternating, for --seconds:
   every request's outcome and time, from its scheduled arrival;
3. fair share: one client sends 256-text batches back to back on two connections while another
   sends single texts open loop at 10% of capacity; the single-text client should see no 503.

Pass marks (issue "Stop means stop"): every request answered (200, 503, binary status 2, or 504 /
status 3 at its deadline) within its deadline plus 1 s; refusals from the first seconds; goodput
at least 0.9 of 1x; the accepted P99 at most --max-queue-ms plus one batch's time.

    python -m benchmarks.shedding [--workers 2] [--seconds 60] [--factor 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.service.settings import CPU_MAX_BATCH_TOKENS
from ringserve.wire import frames as wire

from benchmarks import loadgen
from devkit.http import HttpConn, get_json
from devkit.launcher import SST2, Launched
from devkit.load import percentile

DEADLINE_S = 30.0  # the server's default request deadline (--request-timeout-s)


def kinds(rec: loadgen.Records, protos: list[str]) -> Counter[str]:
    return Counter(loadgen.status_kind(int(c), protos) for c in rec.status)


def refusals(status: np.ndarray) -> np.ndarray:
    return (status == 503) | (status == loadgen.BINARY_BASE + wire.OVERLOADED)


async def overload(
    port: int, binary_port: int, texts: loadgen.Texts, rate: float, seconds: float
) -> loadgen.Records:
    senders: list[Any] = [loadgen.HttpSender(port, None), loadgen.BinarySender(binary_port)]
    times = loadgen.arrival_times(rate, seconds, poisson=True)
    try:
        rec, _ = await loadgen.open_loop(texts, senders, times, DEADLINE_S + 5)
    finally:
        for s in senders:
            s.close()
    return rec


def overload_report(
    rec: loadgen.Records, seconds: float, base: float, batch_ms: float, max_queue_ms: float
) -> bool:
    protos = ["http", "binary"]
    ok = loadgen.is_ok(rec.status)
    answered = rec.status >= 0
    took_s = np.where(answered, (rec.done - rec.sent) / 1e9, np.inf)
    lat_ms = (rec.done - rec.sched) / 1e6
    goodput = float(ok.sum()) / seconds
    late = int((took_s > DEADLINE_S + 1).sum())
    refused = refusals(rec.status)
    first = float(rec.sched[refused].min()) / 1e9 if refused.any() else float("nan")
    p99 = percentile(lat_ms[ok].tolist(), 99)
    bound = max_queue_ms + batch_ms
    print(f"overload: offered {len(rec.sched) / seconds:.1f} req/s for {seconds:g} s, "
          f"goodput {goodput:.1f}/s = {goodput / base:.3f} of 1x ({base:.1f}/s)")  # fmt: skip
    print(f"  outcomes: {dict(kinds(rec, protos).most_common())}")
    print(f"  first refusal at {first:.2f} s; answered later than deadline + 1 s: {late}; "
          f"slowest answer {float(took_s[answered].max()):.2f} s")  # fmt: skip
    for p_i, proto in enumerate(protos):
        sel = ok & (rec.proto == p_i)
        xs = lat_ms[sel].tolist()
        if xs:
            print(f"  {proto:<6} accepted n={len(xs)} p50 {percentile(xs, 50):.1f} ms "
                  f"p99 {percentile(xs, 99):.1f} ms")  # fmt: skip
    lag = ((rec.sent - rec.sched) / 1e6)[ok].tolist()
    sent_ms = ((rec.done - rec.sent) / 1e6)[ok].tolist()
    print(f"  the client's own lag (sent after scheduled) p99 {percentile(lag, 99):.1f} ms; "
          f"accepted from sent p99 {percentile(sent_ms, 99):.1f} ms")  # fmt: skip
    print(f"  accepted p99 {p99:.1f} ms against --max-queue-ms {max_queue_ms:g} + one batch "
          f"{batch_ms:.1f} ms = {bound:.1f} ms")  # fmt: skip
    passed = bool(
        late == 0
        and int((rec.status < 0).sum()) == 0
        and first < 5.0
        and goodput >= 0.9 * base
        and p99 <= bound
    )
    print(f"  overload pass marks: {'met' if passed else 'MISSED'}")
    return passed


async def fair_share(
    port: int, texts: loadgen.Texts, rate: float, seconds: float
) -> tuple[Counter[str], Counter[int]]:
    """Batches of 256 back to back on two connections, beside single texts at `rate`."""
    batch_codes: Counter[int] = Counter()
    stop = time.monotonic() + seconds
    docs = [
        json.dumps({"texts": [texts.text(k * 256 + i).decode() for i in range(256)]}).encode()
        for k in range(8)
    ]

    async def batches(index: int) -> None:
        conn = await HttpConn.open(port)
        k = index
        while time.monotonic() < stop:
            answer = await conn.call("POST", "/v1/classify", docs[k % len(docs)])
            batch_codes[answer.status] += 1
            k += 2
            if conn.closed:
                conn = await HttpConn.open(port)
        conn.close()

    sender = loadgen.HttpSender(port, None)
    times = loadgen.arrival_times(rate, seconds, poisson=True)
    try:
        load = asyncio.gather(batches(0), batches(1))
        rec, _ = await loadgen.open_loop(texts, [sender], times, DEADLINE_S + 5)
        await load
    finally:
        sender.close()
    return kinds(rec, ["http"]), batch_codes


async def run(srv: Launched, texts: loadgen.Texts, ns: argparse.Namespace) -> bool:
    base = await loadgen.capacity(srv.port, texts, ns.capacity_seconds)
    stats = get_json(srv.port, "/v1/stats")
    rate = stats.get("pool_tokens_per_s") or 0.0
    per_worker = rate / max(1, ns.workers)
    batch_ms = CPU_MAX_BATCH_TOKENS / per_worker * 1000 if per_worker else float("nan")
    print(f"capacity (closed loop, HTTP c=32, {ns.capacity_seconds:g} s): {base:.1f} req/s; "
          f"the pool's measured rate {rate:.0f} tokens/s, "
          f"one batch about {batch_ms:.1f} ms")  # fmt: skip
    rec = await overload(srv.port, srv.binary_port, texts, ns.factor * base, ns.seconds)
    passed = overload_report(rec, ns.seconds, base, batch_ms, float(stats["max_queue_ms"]))
    await asyncio.sleep(2)  # the queue empties before the next phase
    singles, batch_codes = await fair_share(srv.port, texts, 0.1 * base, ns.fair_seconds)
    fair = singles.get("http 503", 0) == 0
    print(f"fair share ({ns.fair_seconds:g} s): single texts at {0.1 * base:.1f}/s: "
          f"{dict(singles)}; 256-text batches: {dict(batch_codes)}; "
          f"{'met' if fair else 'MISSED'} (no 503 for the single-text client)")  # fmt: skip
    return passed and fair


def main(argv: list[str] | None = None) -> int:
    import uvloop

    p = argparse.ArgumentParser(prog="python -m benchmarks.shedding", description=__doc__)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--factor", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--capacity-seconds", type=float, default=10.0)
    p.add_argument("--fair-seconds", type=float, default=30.0)
    p.add_argument("--texts", type=Path, default=SST2, help="TSV, text in column 1")
    p.add_argument("--server-args", default="", help="extra `ringserve serve` options")
    ns = p.parse_args(argv)
    args = ["--workers", str(ns.workers), *ns.server_args.split()]
    with loadgen.served_texts(ns.texts, args, "ringserve-shedding-") as (srv, texts):
        passed = uvloop.run(run(srv, texts, ns))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
