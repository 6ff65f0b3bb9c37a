"""Failover under load: SIGKILL a serving worker 20+ times; count failed requests and time the
pool back to full strength (every slot served by a ready worker, the victim gone).

Usage: python -m benchmarks.failover [--kills 20] [--workers 2] [--concurrency 16]
Target: 0 failed requests, median time to whole at most 1.0 s.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import threading
import time

from benchmarks.loadgen import LoadResult, classify_request, run_load
from benchmarks.serving import load_texts, start_server, wait_ready
from service.cli import ctl_request


def workers(path: str) -> list[dict[str, object]]:
    rows = ctl_request(path, {"cmd": "status"})["workers"]
    assert isinstance(rows, list)
    return rows


def serving(path: str) -> dict[int, int]:
    return {
        int(w["id"]): int(w["pid"])
        for w in workers(path)  # type: ignore[call-overload]
        if w["state"] in ("ready", "degraded") and int(w["id"]) >= 0
    }  # type: ignore[call-overload]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--port", type=int, default=18941)
    p.add_argument("--spare-timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    control = f"/tmp/ringserve-bench-{args.port}.sock"
    proc = start_server(args.port, ["--workers", str(args.workers), "--spares", "1"])
    texts = load_texts(2000)
    requests = [classify_request(t) for t in texts]
    result: list[LoadResult] = []
    stop = threading.Event()

    def load() -> None:
        import uvloop

        async def go() -> None:
            while not stop.is_set():
                r = await run_load(
                    "127.0.0.1", args.port, requests, args.concurrency, 2.0, warmup_s=0
                )
                result.append(r)

        uvloop.run(go())

    times: list[float] = []
    rng = random.Random(1)
    try:
        wait_ready(args.port, proc)
        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        for k in range(args.kills):
            deadline = time.monotonic() + args.spare_timeout
            while not any(w["state"] == "spare" for w in workers(control)):
                if time.monotonic() > deadline:
                    raise SystemExit("no warm spare came up")
                time.sleep(0.05)
            pids = serving(control)
            if len(pids) < args.workers:
                time.sleep(0.05)
                continue
            victim = pids[rng.choice(sorted(pids))]
            t0 = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            while True:
                now = serving(control)
                if len(now) == args.workers and victim not in now.values():
                    break
                time.sleep(0.005)
            times.append(time.monotonic() - t0)
            print(
                f"kill {k + 1:2d}: pid {victim} -> whole in {times[-1] * 1000:7.1f} ms", flush=True
            )
        stop.set()
        thread.join(30)
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    ok = sum(r.ok for r in result)
    failed = sum(v for r in result for c, v in r.codes.items() if c != 200)
    print(f"kills: {len(times)}  requests ok: {ok}  failed: {failed}")
    print(
        f"time to whole: median {statistics.median(times) * 1000:.1f} ms, "
        f"max {max(times) * 1000:.1f} ms (target: 0 failed, median <= 1000 ms)"
    )
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
