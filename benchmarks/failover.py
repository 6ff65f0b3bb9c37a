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
import tempfile
import threading
import time

from benchmarks.common import Launched, LoadResult, classify_request, load_texts, run_load
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
    p.add_argument("--spare-timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="ringserve-failover-")
    srv = Launched(tmp.name, ["--workers", str(args.workers), "--spares", "1"], binary=False)
    control = srv.control
    texts = load_texts(n=2000)
    requests = [classify_request(t) for t in texts]
    result: list[LoadResult] = []
    stop = threading.Event()

    def load() -> None:
        import uvloop

        async def go() -> None:
            while not stop.is_set():
                r = await run_load(srv.port, requests, args.concurrency, 2.0, warmup_s=0)
                result.append(r)

        uvloop.run(go())

    times: list[float] = []
    rng = random.Random(1)
    try:
        srv.wait_ready()
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
        srv.terminate()
        tmp.cleanup()
    ok = sum(r.ok for r in result)
    failed = sum(r.failed for r in result)
    print(f"kills: {len(times)}  requests ok: {ok}  failed: {failed}")
    print(
        f"time to whole: median {statistics.median(times) * 1000:.1f} ms, "
        f"max {max(times) * 1000:.1f} ms (target: 0 failed, median <= 1000 ms)"
    )
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
