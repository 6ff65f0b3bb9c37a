"""Failover and start-up, zygote against spawn, side by side in one run.

1. Time to ready and memory: for --workers N, the time from `ringserve serve` to N ready workers,
   and each worker's PSS (proportional set size: shared pages split between their users) with
   the zygote's share counted, as N grows.
2. Right after readiness: SIGKILL a serving worker the moment the server says ready (the spare
   may still be booting) and time the pool back to whole.
3. Under load: SIGKILL a serving worker --kills times, with --spares 0 and with a spare; the
   median and maximum time to whole (every slot served by a ready worker, the victim gone) and
   the failed requests.

Usage: python -m benchmarks.failover [--kills 20] [--workers 2] [--concurrency 8]
Targets (issue 13): 0 failed requests; with --spares 0 a median time to whole of 1.0 s or less.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ringserve.service.pool.policy import STABLE_S

from devkit.http import classify_request
from devkit.launcher import Launched, load_texts
from devkit.load import LoadResult, run_load

POLL_S = 0.005


def serving(srv: Launched) -> dict[int, int]:
    return {
        int(w["id"]): int(w["pid"])
        for w in srv.ctl({"cmd": "status"})["workers"]
        if w["state"] in ("ready", "degraded") and int(w["id"]) >= 0
    }


def spares_ready(srv: Launched) -> int:
    return sum(1 for w in srv.ctl({"cmd": "status"})["workers"] if w["state"] == "spare")


def pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def zygote_pid(srv: Launched) -> int | None:
    pid = None
    for line in srv.logs().splitlines():
        if '"event": "zygote_started"' in line:
            pid = int(json.loads(line)["pid"])
    return pid


RUNTIME: list[str] = []  # --runtime for every server, when given


@contextmanager
def server(method: str, workers: int, spares: int) -> Iterator[Launched]:
    with tempfile.TemporaryDirectory(prefix="ringserve-failover-") as tmp:
        args = ["--workers", str(workers), "--spares", str(spares), "--start-method", method]
        args += RUNTIME
        srv = Launched(tmp, args, binary=False)
        try:
            yield srv
        finally:
            srv.terminate()


def time_to_whole(srv: Launched, n: int, victim: int, timeout: float = 180.0) -> float:
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    while time.monotonic() - t0 < timeout:
        now = serving(srv)
        if len(now) == n and victim not in now.values():
            return time.monotonic() - t0
        time.sleep(POLL_S)
    raise SystemExit(f"pool not whole {timeout} s after a SIGKILL")


# -- 1. time to ready and PSS ----------------------------------------------------------------------
def startup(method: str, n: int) -> dict[str, float]:
    t0 = time.monotonic()
    with server(method, n, 0) as srv:
        srv.wait_ready(n, timeout=300)
        ready_s = time.monotonic() - t0
        time.sleep(1.0)  # let boot-time garbage settle before reading memory
        pids = list(serving(srv).values())
        workers_pss = sum(pss_bytes(p) for p in pids)
        zpid = zygote_pid(srv) if method == "zygote" else None
        zyg = pss_bytes(zpid) if zpid else 0
    return {"ready_s": ready_s, "pss_per_worker": (workers_pss + zyg) / n, "zygote_pss": zyg}


# -- 2. right after readiness ----------------------------------------------------------------------
def after_ready(method: str, workers: int, trials: int, texts: list[str]) -> list[float]:
    out = []
    for _ in range(trials):
        with server(method, workers, 1) as srv:
            srv.wait_ready(timeout=300)  # the moment /v2/health/ready says 200
            with background_load(srv, texts, 4):
                pids = serving(srv)
                out.append(time_to_whole(srv, workers, pids[min(pids)]))
    return out


# -- 3. under load ---------------------------------------------------------------------------------
@contextmanager
def background_load(
    srv: Launched, texts: list[str], concurrency: int
) -> Iterator[list[LoadResult]]:
    requests = [classify_request(t) for t in texts]
    results: list[LoadResult] = []
    stop = threading.Event()

    def load() -> None:
        import uvloop

        async def go() -> None:
            while not stop.is_set():
                results.append(await run_load(srv.port, requests, concurrency, 1.0, warmup_s=0))

        uvloop.run(go())

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        yield results
    finally:
        stop.set()
        thread.join(60)


def under_load(
    method: str, workers: int, spares: int, kills: int, concurrency: int, texts: list[str]
) -> tuple[list[float], int, int]:
    rng = random.Random(1)
    times: list[float] = []
    with server(method, workers, spares) as srv:
        srv.wait_ready(workers, timeout=300)
        with background_load(srv, texts, concurrency) as results:
            while len(times) < kills:
                wait_until(lambda: spares_ready(srv) >= spares and len(serving(srv)) == workers)
                # Each victim has served a while: the supervisor counts a worker that dies
                # within STABLE_S of being ready as crash-looping and backs off.
                time.sleep(STABLE_S + 0.5)
                pids = serving(srv)
                times.append(time_to_whole(srv, workers, pids[rng.choice(sorted(pids))]))
            time.sleep(1.0)  # answers to the last rerouted requests
    ok = sum(r.ok for r in results)
    failed = sum(r.failed for r in results)
    return times, ok, failed


def wait_until(predicate: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for the pool")
        time.sleep(0.02)


def ms(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1000:7.1f} ms, max {max(xs) * 1000:7.1f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument(
        "--spawn-kills", type=int, default=5, help="kills with spawn (each waits for a cold boot)"
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--sizes", default="1,2,4", help="--workers values for time to ready and PSS")
    p.add_argument("--after-ready-trials", type=int, default=3)
    p.add_argument("--runtime", help="the servers' --runtime (default: theirs, auto)")
    p.add_argument("--sections", default="1,2,3", help="which of the three parts to run")
    args = p.parse_args(argv)
    if args.runtime:
        RUNTIME[:] = ["--runtime", args.runtime]
    sections = {int(v) for v in args.sections.split(",")}
    texts = load_texts(n=2000)
    failed_total = 0
    print(f"runtime: {args.runtime or 'the server default (auto)'}")
    if 1 in sections:
        startups(args.sizes)
    if 2 in sections:
        after_readiness(args.workers, args.after_ready_trials, texts)
    if 3 in sections:
        failed_total = kills_under_load(args, texts)
    return 0 if failed_total == 0 else 1


def startups(sizes: str) -> None:
    print("1. time to ready and PSS per worker (zygote's PSS shared out over its workers)")
    for n in [int(v) for v in sizes.split(",")]:
        for method in ("zygote", "spawn"):
            r = startup(method, n)
            print(
                f"   --workers {n} {method:6s}: ready in {r['ready_s']:6.2f} s, "
                f"PSS/worker {r['pss_per_worker'] / 2**20:6.1f} MiB"
                + (f" (zygote {r['zygote_pss'] / 2**20:.1f} MiB)" if r["zygote_pss"] else ""),
                flush=True,
            )


def after_readiness(workers: int, trials: int, texts: list[str]) -> None:
    print(f"2. SIGKILL at readiness (--workers {workers} --spares 1), under light load")
    for method in ("zygote", "spawn"):
        times = after_ready(method, workers, trials, texts)
        print(f"   {method:6s}: {len(times)} trials, whole again {ms(times)}", flush=True)


def kills_under_load(args: argparse.Namespace, texts: list[str]) -> int:
    failed_total = 0
    print(f"3. SIGKILLs under load (--workers {args.workers}, {args.concurrency} clients)")
    cases = [
        ("zygote", 0, args.kills),
        ("zygote", 1, args.kills),
        ("spawn", 1, args.spawn_kills),
        ("spawn", 0, args.spawn_kills),
    ]
    for method, spares, kills in cases:
        times, ok, failed = under_load(method, args.workers, spares, kills, args.concurrency, texts)
        failed_total += failed
        print(
            f"   {method:6s} --spares {spares}: {len(times)} kills, whole again {ms(times)}; "
            f"requests ok {ok}, failed {failed}",
            flush=True,
        )
    return failed_total


if __name__ == "__main__":
    sys.exit(main())
