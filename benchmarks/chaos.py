"""Chaos at half of capacity: what every fault costs, per 10 s window, sized in the same run.

Capacity first (closed loop, HTTP c=32); then open-loop Poisson load at --share of it, HTTP and
binary alternating, for --seconds, while a schedule of faults runs:
  - a serving worker SIGKILLed every --kill-every seconds;
  - one serving worker SIGSTOPped for 10 s (declared hung after the heartbeat timeout);
  - the zygote SIGKILLed;
  - `ctl scale 3`, then `ctl scale 2`;
  - `ctl reload`.
Printed: the answers by kind, the latency per 10 s window, the P99 over the run leaving out the
requests the stopped worker held, and the slowest answer against the heartbeat timeout + 2 s.

Pass marks (issue "Stop means stop"): 0 answers other than 200; P99 at most 1.5 s (leaving out
what the stopped worker held); no answer slower than the heartbeat timeout plus 2 s.

    python -m benchmarks.chaos [--seconds 180] [--share 0.5] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import loadgen
from benchmarks.failover import zygote_pid
from devkit.launcher import SST2, Launched
from devkit.load import percentile

HEARTBEAT_S = 5.0  # the server's default --heartbeat-timeout-s
STOP_S = 10.0


def serving(srv: Launched) -> dict[int, int]:
    rows = srv.ctl({"cmd": "status"})["workers"]
    return {int(w["id"]): int(w["pid"]) for w in rows if w["state"] in ("ready", "degraded")}


class Faults:
    """The fault schedule, run in a thread; each fault's time on the monotonic clock (ns)."""

    def __init__(self, srv: Launched, seconds: float, kill_every: float) -> None:
        self.srv, self.seconds, self.kill_every = srv, seconds, kill_every
        self.log: list[tuple[int, str]] = []
        self.stopped_at = 0
        self.stopped_pid = 0  # never a kill's victim: it is the hung-worker fault
        self.done = threading.Event()
        self.rng = random.Random(7)
        self.thread = threading.Thread(target=self.run, daemon=True)

    def note(self, what: str) -> None:
        self.log.append((time.monotonic_ns(), what))

    def plan(self) -> list[tuple[float, str]]:
        s = self.seconds
        steps = [(t, "kill") for t in np.arange(self.kill_every, s - 5, self.kill_every)]
        steps += [(0.2 * s, "stop"), (0.35 * s, "zygote"), (0.5 * s, "scale 3")]
        steps += [(0.62 * s, "scale 2"), (0.78 * s, "reload")]
        return sorted((float(t), w) for t, w in steps)

    def run(self) -> None:
        start = time.monotonic()
        for at, what in self.plan():
            while time.monotonic() - start < at and not self.done.is_set():
                time.sleep(0.01)
            if self.done.is_set():
                return
            try:
                self.act(what)
            except (OSError, KeyError, ValueError) as exc:
                self.note(f"{what} failed: {exc}")

    def act(self, what: str) -> None:
        srv = self.srv
        if what in ("kill", "stop"):
            pids = {k: v for k, v in serving(srv).items() if v != self.stopped_pid}
            if not pids:
                self.note(f"{what}: no serving worker")
                return
            pid = pids[self.rng.choice(sorted(pids))]
            if what == "kill":
                os.kill(pid, signal.SIGKILL)
                self.note(f"SIGKILL worker {pid}")
            else:
                os.kill(pid, signal.SIGSTOP)
                self.stopped_at, self.stopped_pid = time.monotonic_ns(), pid
                self.note(f"SIGSTOP worker {pid}")
                threading.Timer(STOP_S, self.resume, (pid,)).start()
        elif what == "zygote":
            pid = zygote_pid(srv)
            if pid:
                os.kill(pid, signal.SIGKILL)
            self.note(f"SIGKILL zygote {pid}")
        elif what.startswith("scale"):
            n = int(what.split()[1])
            self.note(f"ctl scale {n}: {srv.ctl({'cmd': 'scale', 'workers': n}).get('ok')}")
        elif what == "reload":
            self.note(f"ctl reload: {srv.ctl({'cmd': 'reload'}).get('ok')}")

    def resume(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
            self.note(f"SIGCONT {pid}")
        except ProcessLookupError:
            self.note(f"SIGCONT {pid}: gone (declared hung and killed)")


def windows(rec: loadgen.Records, seconds: float) -> list[dict[str, Any]]:
    out = []
    ok = loadgen.is_ok(rec.status)
    lat = (rec.done - rec.sched) / 1e6
    for lo in np.arange(0, seconds, 10.0):
        sel = (rec.sched >= lo * 1e9) & (rec.sched < (lo + 10) * 1e9)
        xs = lat[sel & ok].tolist()
        out.append({"from_s": float(lo), "n": int(sel.sum()), "not_ok": int((sel & ~ok).sum()),
                    "p50": percentile(xs, 50), "p99": percentile(xs, 99),
                    "max": max(xs) if xs else float("nan")})  # fmt: skip
    return out


def report(rec: loadgen.Records, t0: int, faults: Faults, seconds: float) -> bool:
    protos = ["http", "binary"]
    kinds = Counter(loadgen.status_kind(int(c), protos) for c in rec.status)
    ok = loadgen.is_ok(rec.status)
    lat_s = (rec.done - rec.sched) / 1e9
    stop = (faults.stopped_at - t0) if faults.stopped_at else -1
    held = np.zeros(len(rec.sched), bool)
    if stop >= 0:  # sent before the stall began (or just after) and answered after it
        held = (rec.sent <= stop + 1e9) & (rec.done >= stop + 2e9) & (rec.sched <= stop + 1e9)
    rest = lat_s[ok & ~held].tolist()
    p99 = percentile(rest, 99)
    slowest = float(lat_s[ok].max()) if ok.any() else float("inf")
    print(f"answers: {dict(kinds.most_common())}")
    for at, what in faults.log:
        print(f"  {(at - t0) / 1e9:7.2f} s  {what}")
    print("window   n      not-200  p50 ms   p99 ms   max ms")
    for w in windows(rec, seconds):
        print(f"{w['from_s']:5.0f} s {w['n']:6d} {w['not_ok']:8d} {w['p50']:8.1f} "
              f"{w['p99']:8.1f} {w['max']:8.1f}")  # fmt: skip
    print(f"P99 over the run {p99 * 1000:.1f} ms, leaving out {int(held.sum())} requests the "
          f"stopped worker held; slowest answer {slowest:.2f} s "
          f"(heartbeat timeout {HEARTBEAT_S:g} s + 2 s)")  # fmt: skip
    passed = int((~ok).sum()) == 0 and p99 <= 1.5 and slowest <= HEARTBEAT_S + 2
    print(f"chaos pass marks: {'met' if passed else 'MISSED'}")
    return passed


def main(argv: list[str] | None = None) -> int:
    import uvloop

    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--share", type=float, default=0.5, help="of the measured capacity")
    p.add_argument("--kill-every", type=float, default=5.0)
    p.add_argument("--capacity-seconds", type=float, default=8.0)
    p.add_argument("--texts", type=Path, default=SST2, help="TSV, text in column 1")
    p.add_argument("--server-args", default="", help="extra `ringserve serve` options")
    p.add_argument("--json", default=None, help="also write the windows here")
    ns = p.parse_args(argv)
    args = ["--workers", str(ns.workers), *ns.server_args.split()]
    with loadgen.served_texts(ns.texts, args, "ringserve-chaos-") as (srv, texts):
        cap = uvloop.run(loadgen.capacity(srv.port, texts, ns.capacity_seconds))
        rate = ns.share * cap
        print(f"capacity {cap:.1f} req/s (closed loop, HTTP c=32); chaos load {rate:.1f} "
              f"req/s for {ns.seconds:g} s, HTTP and binary", flush=True)  # fmt: skip
        times = loadgen.arrival_times(rate, ns.seconds, poisson=True)
        senders: list[Any] = [loadgen.HttpSender(srv.port, None),
                              loadgen.BinarySender(srv.binary_port)]  # fmt: skip
        faults = Faults(srv, ns.seconds, ns.kill_every)

        async def go() -> tuple[loadgen.Records, int]:
            faults.thread.start()
            try:
                return await loadgen.open_loop(texts, senders, times, 30.0)
            finally:
                for s in senders:
                    s.close()

        rec, t0 = uvloop.run(go())
        faults.done.set()
        passed = report(rec, t0, faults, ns.seconds)
        if ns.json:
            Path(ns.json).write_text(json.dumps(windows(rec, ns.seconds), indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
