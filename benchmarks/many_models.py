"""Many models on one pool against one model a pool, in one run on the same cores and texts.

(a) alone:  a single-model server on the busy model (the default SST-2 artifact), closed loop at
            c=32: its throughput, the reference.
(b) shared: one two-model server (`--model busy=DIR --model light=DIR`): the busy model's
            closed loop at c=32 as in (a) and, beside it, the light model's requests sent on a
            clock (open loop) at a tenth of the total ((a)'s throughput / 10), over every tenth
            text: total throughput (target >= 0.9 x a), and the light model's P99.
(b') mixed: (b) as first written: one closed loop of 32 clients, each sending the light model
            every tenth request. Kept for comparison, but not the light model's P99 target: each
            light request leaves the instant its client's last (busy) answer came, which is the
            instant that worker started its next busy batch, so every light text lands at a
            batch's start; (c) sends on a clock and cannot couple so. (b) gives the light model
            the same client, texts and rate as (c), so the busy traffic is the one difference.
(c) light alone: the light model on a single-model server of its own, offered the light rate
            (b) achieved (a tenth of (a)'s when (b) did not run), open loop (requests sent on a
            clock, not when the last answer came, each latency counted from its due time), over
            the texts (b) sent the light model: its P99 (target: b's light P99 within 2x).
(d) static split: two single-model servers, `--workers 1` each, each pinned to its own CPU
            (the server pins its workers within the CPUs it is started on), the same 90/10 load.
(e) memory: each serving worker's RSS at start (control `status`) with one model, two and three
            (busy, light and the tiny NLI BERT of devkit/repository.py): memory per extra model
            per worker; and the server's own per-model figure (`models[].rss_bytes_per_worker`).

(r) rounds: (a), (b) and (c) in turns, `--rounds` times, the three servers started once and
            kept up (each idle while another is measured); every round's (b)/(a) and light P99
            (b)/(c), their medians, and the light P99s pooled over every round. One (a) and one
            (b) a minute apart moved by a tenth here (steal from the VM's neighbours), which is
            the whole margin of the 0.9 target; rounds minutes apart no more show the spread.

The light model is, by default, a second copy of the default artifact under another name (two
real models of one size); `--light nli` makes it the tiny NLI BERT instead. A phase whose server
cannot start (an option this checkout lacks) is reported as not run, with the reason. Only
127.0.0.1. Results JSON under benchmarks/results/.

    python -m benchmarks.many_models [--seconds 10] [--light copy|nli] [--phases abcmde]
    python -m benchmarks.many_models --phases r --rounds 5 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from devkit.http import HttpConn, http_message
from devkit.launcher import ROOT, SST2, Launched, load_texts
from devkit.load import LoadResult, percentile

CONCURRENCY = 32
SHARE = 10  # one request in SHARE is the light model's (10%)
RESULTS = ROOT / "benchmarks" / "results"
MIB = 1 << 20


@dataclass
class Target:
    """Where one model's requests go: a port, and the name to put in the body (None: none)."""

    port: int
    model: str | None = None

    def request(self, text: str) -> bytes:
        doc: dict[str, Any] = {"text": text}
        if self.model is not None:
            doc["model"] = self.model
        body = json.dumps(doc).encode()
        return http_message("POST", "/v1/classify", body, {"Content-Type": "application/json"})


@dataclass
class Mixed:
    """Answers by model key ("busy", "light")."""

    seconds: float
    by: dict[str, LoadResult] = field(default_factory=dict)

    def result(self, key: str) -> LoadResult:
        return self.by.setdefault(key, LoadResult(CONCURRENCY, self.seconds))

    @property
    def rps(self) -> float:
        return sum(r.ok for r in self.by.values()) / self.seconds

    @property
    def failed(self) -> int:
        return sum(r.failed for r in self.by.values())


# -- load loops ----------------------------------------------------------------------------------
async def _closed_client(
    conns: dict[int, HttpConn],
    plan: list[tuple[str, Target, bytes]],
    offset: int,
    stop_at: float,
    out: Mixed,
) -> None:
    i = offset
    while time.monotonic() < stop_at:
        key, target, req = plan[i % len(plan)]
        i += 1
        conn = conns.get(target.port)
        if conn is None or conn.closed:
            conn = conns[target.port] = await HttpConn.open(target.port)
        t0 = time.perf_counter()
        try:
            answer = await conn.send(req)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            out.result(key).codes[0] += 1
            conn.close()
            continue
        res = out.result(key)
        res.codes[answer.status] += 1
        if answer.status == 200:
            res.latencies_ms.append((time.perf_counter() - t0) * 1000)
    for c in conns.values():
        c.close()


def mixed_plan(targets: dict[str, Target], texts: list[str]) -> list[tuple[str, Target, bytes]]:
    """Requests in order, one in SHARE for "light" (when it is there), the rest for "busy"."""
    plan = []
    for i, text in enumerate(texts):
        key = "light" if "light" in targets and i % SHARE == SHARE - 1 else "busy"
        plan.append((key, targets[key], targets[key].request(text)))
    return plan


async def closed_loop(
    targets: dict[str, Target], texts: list[str], seconds: float, warmup_s: float = 2.0
) -> Mixed:
    """CONCURRENCY clients, each sending its next request when its last answer is in."""
    plan = mixed_plan(targets, texts)
    out = Mixed(0.0)
    for run_s in (warmup_s, seconds):  # an uncounted warm-up, then the measured run
        out = Mixed(run_s)
        t0 = time.monotonic()
        await asyncio.gather(
            *(_closed_client({}, plan, k * 7919, t0 + run_s, out) for k in range(CONCURRENCY))
        )
        out.seconds = time.monotonic() - t0
        for r in out.by.values():
            r.seconds = out.seconds
    return out


async def open_loop(target: Target, texts: list[str], rate: float, seconds: float) -> LoadResult:
    """Requests sent at a fixed `rate` whatever the answers, each latency counted from its
    scheduled send time (so a stall counts against the server, not hidden by the client)."""
    reqs = [target.request(t) for t in texts]
    idle: list[HttpConn] = []
    out = LoadResult(0, seconds)
    pending: set[asyncio.Task[None]] = set()

    async def one(req: bytes, due: float) -> None:
        conn = idle.pop() if idle else await HttpConn.open(target.port)
        try:
            answer = await conn.send(req)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            out.codes[0] += 1
            conn.close()
            return
        out.codes[answer.status] += 1
        if answer.status == 200:
            out.latencies_ms.append((time.perf_counter() - due) * 1000)
        if not conn.closed:
            idle.append(conn)

    t0 = time.perf_counter()
    n = int(rate * seconds)
    for k in range(n):
        due = t0 + k / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        task = asyncio.create_task(one(reqs[k % len(reqs)], due))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    out.seconds = time.perf_counter() - t0
    out.concurrency = max(1, len(idle))
    for c in idle:
        c.close()
    return out


async def busy_and_light(
    busy: Target, light: Target, texts: list[str], rate: float, seconds: float
) -> Mixed:
    """closed_loop() of the busy model alone and, once its warm-up is over, open_loop() of the
    light model at `rate` over the texts mixed_plan() gives it (every SHARE-th)."""
    warmup_s = 2.0

    async def later() -> LoadResult:
        await asyncio.sleep(warmup_s)
        return await open_loop(light, texts[SHARE - 1 :: SHARE], rate, seconds)

    m, lr = await asyncio.gather(closed_loop({"busy": busy}, texts, seconds, warmup_s), later())
    lr.seconds = m.seconds  # both over the measured stretch
    m.by["light"] = lr
    return m


# -- servers -------------------------------------------------------------------------------------
@contextlib.contextmanager
def server(tmp: str, args: list[str], cpus: set[int] | None = None) -> Iterator[Launched]:
    """A server on free ports (no spare: idle processes only blur the figures), started within
    `cpus` when given (the server pins its workers within the CPUs it starts on)."""
    mine = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        srv = Launched(tmp, [*args, "--spares", "0"], binary=False)
    finally:
        os.sched_setaffinity(0, mine)
    try:
        srv.wait_ready(timeout=240)
        wait_settled(srv)
        yield srv
    finally:
        srv.terminate()


def wait_settled(srv: Launched, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [w["state"] for w in srv.ctl({"cmd": "status"})["workers"]]
        if states and all(s == "ready" for s in states):
            return
        time.sleep(0.1)
    raise TimeoutError("the pool did not settle")


def worker_rss(srv: Launched) -> dict[str, Any]:
    """Mean RSS (MiB) of the serving workers, and the server's per-model figures if it has them."""
    status = srv.ctl({"cmd": "status"})
    rows = [w["rss_bytes"] for w in status["workers"] if w["state"] == "ready"]
    models = {
        m["name"]: round(m["rss_bytes_per_worker"] / MIB, 1)
        for m in status.get("models", [])
        if isinstance(m, dict) and isinstance(m.get("rss_bytes_per_worker"), int)
    }
    return {
        "worker_rss_mib": round(sum(rows) / len(rows) / MIB, 1),
        "workers": len(rows),
        "per_model_mib": models,
    }


def light_artifact(kind: str, default: Path, tmp: Path) -> Path:
    if kind == "copy":
        return default
    from devkit.repository import BUILT, NLI, export_artifact

    return export_artifact(BUILT[NLI], tmp / "built", NLI)


# -- phases --------------------------------------------------------------------------------------
class Run:
    def __init__(self, seconds: float, light: str) -> None:
        from ringserve.factory.build import default_artifact_dir

        self.seconds = seconds
        self.light_kind = light
        self.texts = load_texts(SST2, 1000)
        self.tmp = tempfile.mkdtemp(prefix="ringserve-many-")
        self.busy = Path(default_artifact_dir())
        self.light = light_artifact(light, self.busy, Path(self.tmp))
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
        self.out: dict[str, Any] = {
            "code": head.stdout.decode().strip(),
            "seconds": seconds,
            "light": light,
            "cpus": sorted(os.sched_getaffinity(0)),
            "concurrency": CONCURRENCY,
            "light_share": 1 / SHARE,
        }

    def phase(self, name: str, fn: Any) -> None:
        t0 = time.monotonic()
        try:
            self.out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a phase this checkout cannot run is reported
            why = " ".join(f"{type(exc).__name__}: {str(exc)[-600:]}".split())
            self.out[name] = {"not_run": why}
        print(
            f"{name}: {json.dumps(self.out[name])[:400]} ({time.monotonic() - t0:.0f} s)",
            flush=True,
        )

    def alone(self) -> dict[str, Any]:
        with server(self.tmp, ["--model", str(self.busy)]) as srv:
            memory = worker_rss(srv)
            m = uvloop.run(closed_loop({"busy": Target(srv.port)}, self.texts, self.seconds))
        busy = m.result("busy")
        return {
            "rps": round(m.rps, 1),
            "p50_ms": busy.pct(50),
            "p99_ms": busy.pct(99),
            "failed": m.failed,
            "memory": memory,
        }

    def light_rate(self) -> tuple[float, str]:
        """The light model's rate: a tenth of the total, the total taken as (a)'s throughput
        (one in SHARE of what the pool serves); 40/s when (a) did not run."""
        a = self.out.get("a_alone", {}).get("rps")
        return (round(a / SHARE, 1), "(a)'s throughput / 10") if a else (40.0, "40/s")

    def busy_and_light(self, port: int, rate: float) -> Mixed:
        """busy_and_light() on a two-model server's "busy" and "light" models."""
        busy, light = Target(port, "busy"), Target(port, "light")
        return uvloop.run(busy_and_light(busy, light, self.texts, rate, self.seconds))

    def shared(self) -> dict[str, Any]:
        """The busy model's closed loop at c=32 and, beside it, the light model's requests sent
        on a clock (open_loop) at a tenth of the total: the same client, texts and rate that
        (c) measures the light model alone with, so that the busy traffic is the only
        difference between (b)'s light P99 and (c)'s."""
        rate, source = self.light_rate()
        args = ["--model", f"busy={self.busy}", "--model", f"light={self.light}"]
        with server(self.tmp, args) as srv:
            memory = worker_rss(srv)
            m = self.busy_and_light(srv.port, rate)
        return mixed_row(m) | {"light_rate": rate, "rate_from": source, "memory": memory}

    def shared_mixed(self) -> dict[str, Any]:
        """(b) as it first was: one closed loop of 32 clients, each sending the light model
        every tenth request, right when its last answer came (see the module's note)."""
        args = ["--model", f"busy={self.busy}", "--model", f"light={self.light}"]
        with server(self.tmp, args) as srv:
            targets = {"busy": Target(srv.port, "busy"), "light": Target(srv.port, "light")}
            m = uvloop.run(closed_loop(targets, self.texts, self.seconds))
        return mixed_row(m)

    def light_alone(self) -> dict[str, Any]:
        rate, source = self.out.get("b_shared", {}).get("light_rps"), "(b)'s light rate"
        if not rate:  # (b) did not run: a tenth of what the busy model did alone
            rate, source = self.out.get("a_alone", {}).get("rps", 0) / SHARE, "a tenth of (a)"
        if not rate:
            raise RuntimeError("needs (b)'s light rate or (a)'s, and neither ran")
        # The texts (b) sent the light model (mixed_plan), so both P99s are over the same texts.
        texts = self.texts[SHARE - 1 :: SHARE]
        with server(self.tmp, ["--model", str(self.light)]) as srv:
            r = uvloop.run(open_loop(Target(srv.port), texts, rate, self.seconds))
        return {
            "rate": rate,
            "rate_from": source,
            "rps": round(r.rps, 1),
            "p50_ms": r.pct(50),
            "p99_ms": r.pct(99),
            "failed": r.failed,
        }

    def static_split(self) -> dict[str, Any]:
        cpus = sorted(os.sched_getaffinity(0))
        pins = ({cpus[0]}, {cpus[1 % len(cpus)]})
        with (
            server(self.tmp, ["--model", str(self.busy), "--workers", "1"], pins[0]) as a,
            server(self.tmp, ["--model", str(self.light), "--workers", "1"], pins[1]) as b,
        ):
            targets = {"busy": Target(a.port), "light": Target(b.port)}
            m = uvloop.run(closed_loop(targets, self.texts, self.seconds))
        return mixed_row(m) | {"pinned": [sorted(p) for p in pins]}

    def rounds(self, n: int) -> dict[str, Any]:
        """(a), (b) and (c) in turns, `n` times, each server started once and kept up (idle
        while another is measured): the machine drifts by a tenth from minute to minute here,
        so each round's (b)/(a) and light P99 (b)/(c) are taken minutes apart no more, and
        every round is printed. The light rate is a tenth of the first (a)."""
        texts = self.texts[SHARE - 1 :: SHARE]
        shared_args = ["--model", f"busy={self.busy}", "--model", f"light={self.light}"]
        rows: list[dict[str, Any]] = []
        with contextlib.ExitStack() as stack:
            alone = stack.enter_context(server(self.tmp, ["--model", str(self.busy)]))
            shared = stack.enter_context(server(self.tmp, shared_args))
            light = stack.enter_context(server(self.tmp, ["--model", str(self.light)]))
            rate = 0.0
            for k in range(n):
                a = uvloop.run(closed_loop({"busy": Target(alone.port)}, self.texts, self.seconds))
                rate = rate or round(a.rps / SHARE, 1)
                b = self.busy_and_light(shared.port, rate)
                c = uvloop.run(open_loop(Target(light.port), texts, rate, self.seconds))
                row = {
                    "a_rps": round(a.rps, 1),
                    "b_rps": round(b.rps, 1),
                    "b_light_p99_ms": b.result("light").pct(99),
                    "c_light_p99_ms": c.pct(99),
                    "failed": a.failed + b.failed + c.failed,
                }
                row["b_over_a"] = round(row["b_rps"] / row["a_rps"], 3)
                row["p99_b_over_c"] = round(row["b_light_p99_ms"] / row["c_light_p99_ms"], 3)
                print(f"round {k + 1}: {json.dumps(row)}", flush=True)
                rows.append(row | {"b_light_ms": b.result("light").latencies_ms})
                rows[-1]["c_light_ms"] = c.latencies_ms
        pooled_b = [x for r in rows for x in r.pop("b_light_ms")]
        pooled_c = [x for r in rows for x in r.pop("c_light_ms")]
        return {
            "light_rate": rate,
            "rounds": rows,
            "median_b_over_a": statistics.median(r["b_over_a"] for r in rows),
            "median_p99_b_over_c": statistics.median(r["p99_b_over_c"] for r in rows),
            "pooled_light_p99_ms": [percentile(pooled_b, 99), percentile(pooled_c, 99)],
        }

    def memory(self) -> dict[str, Any]:
        nli = (
            self.light
            if self.light_kind == "nli"
            else light_artifact("nli", self.busy, Path(self.tmp))
        )
        third = "busy2" if self.light_kind == "nli" else "nli"
        third_dir = self.busy if self.light_kind == "nli" else nli
        args = [
            "--model",
            f"busy={self.busy}",
            "--model",
            f"light={self.light}",
            "--model",
            f"{third}={third_dir}",
        ]
        with server(self.tmp, args) as srv:
            three = worker_rss(srv)
        one = self.out.get("a_alone", {}).get("memory", {}).get("worker_rss_mib")
        two = self.out.get("b_shared", {}).get("memory", {}).get("worker_rss_mib")
        row: dict[str, Any] = {
            "one": one,
            "two": two,
            "three": three["worker_rss_mib"],
            "three_per_model_mib": three["per_model_mib"],
            "third": third,
        }
        if one and two:
            row["second_model_mib"] = round(two - one, 1)
        if two:
            row["third_model_mib"] = round(three["worker_rss_mib"] - two, 1)
        return row


def mixed_row(m: Mixed) -> dict[str, Any]:
    busy, light = m.result("busy"), m.result("light")
    return {
        "rps": round(m.rps, 1),
        "busy_rps": round(busy.rps, 1),
        "light_rps": round(light.rps, 1),
        "busy_p99_ms": busy.pct(99),
        "light_p50_ms": light.pct(50),
        "light_p99_ms": light.pct(99),
        "failed": m.failed,
    }


def ratio(a: Any, b: Any) -> str:
    return (
        f"{a / b:.2f}" if isinstance(a, int | float) and isinstance(b, int | float) and b else "-"
    )


def report(out: dict[str, Any]) -> None:
    a, b, c, d, e = (
        out.get(k, {})
        for k in ("a_alone", "b_shared", "c_light_alone", "d_static_split", "e_memory")
    )
    print(
        f"\nmany models, {out['cpus']} CPUs, c={CONCURRENCY}, {out['seconds']:.0f} s a phase, "
        f"light model: {out['light']}"
    )
    print("| phase | req/s | vs (a) | light req/s | light P99 ms | failed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in (
        ("(a) busy model alone", a),
        ("(b) both on one pool", b),
        ("(b') both, the 90/10 mix from one closed loop", out.get("b_mixed", {})),
        ("(c) light model alone, (b)'s rate", c),
        ("(d) static split", d),
    ):
        if "not_run" in row:
            print(f"| {name} | not run: {row['not_run'][:80]} | | | | |")
            continue
        light_rps = row.get("light_rps", row.get("rps") if row is c else "-")
        light_p99 = row.get("light_p99_ms", row.get("p99_ms") if row is c else "-")
        print(
            f"| {name} | {row.get('rps', '-')} | {ratio(row.get('rps'), a.get('rps'))} | "
            f"{light_rps} | {_num(light_p99)} | {row.get('failed', '-')} |"
        )
    print(
        f"\n(b)/(a) throughput: {ratio(b.get('rps'), a.get('rps'))} (target >= 0.9); "
        f"light P99 (b)/(c): {ratio(b.get('light_p99_ms'), c.get('p99_ms'))} (target <= 2); "
        f"(b)/(d) throughput: {ratio(b.get('rps'), d.get('rps'))}"
    )
    r = out.get("rounds", {})
    if "not_run" in r:
        print(f"rounds: not run: {r['not_run'][:200]}")
    elif r:
        n, rate = len(r["rounds"]), r["light_rate"]
        print(f"\n(a), (b), (c) in turns, {n} rounds, light rate {rate}/s")
        print("| round | (a) req/s | (b) req/s | (b)/(a) | light P99 ms (b) | (c) | (b)/(c) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for k, row in enumerate(r["rounds"], 1):
            print(
                f"| {k} | {row['a_rps']} | {row['b_rps']} | {row['b_over_a']:.2f} | "
                f"{row['b_light_p99_ms']:.1f} | {row['c_light_p99_ms']:.1f} | "
                f"{row['p99_b_over_c']:.2f} |"
            )
        pb, pc = r["pooled_light_p99_ms"]
        print(
            f"median (b)/(a) {r['median_b_over_a']:.2f} (target >= 0.9); median light P99 "
            f"(b)/(c) {r['median_p99_b_over_c']:.2f}; pooled over every round {pb:.1f} against "
            f"{pc:.1f} ms, {pb / pc:.2f} (target <= 2)"
        )
    if "not_run" in e:
        print(f"memory: not run: {e['not_run'][:200]}")
    elif e:
        print(
            f"worker RSS MiB: one model {e.get('one')}, two {e.get('two')}, three "
            f"{e.get('three')}; second model +{e.get('second_model_mib')}, third "
            f"({e.get('third')}) +{e.get('third_model_mib')}; the server's own per-model "
            f"figures: {e.get('three_per_model_mib')}"
        )


def _num(x: Any) -> str:
    return f"{x:.1f}" if isinstance(x, float) else str(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds a phase")
    p.add_argument("--light", choices=("copy", "nli"), default="copy")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default: results/)")
    p.add_argument(
        "--phases",
        default="abcmde",
        help="which phases to run, in order (default: abcmde, all; m: (b) as one closed loop; "
        "r: (a), (b) and (c) in turns, --rounds times)",
    )
    p.add_argument("--rounds", type=int, default=5, help="rounds of phase r")
    args = p.parse_args(argv)
    run = Run(args.seconds, args.light)
    run.out["phases"] = args.phases
    phases = {
        "a": ("a_alone", run.alone),
        "b": ("b_shared", run.shared),
        "m": ("b_mixed", run.shared_mixed),
        "c": ("c_light_alone", run.light_alone),
        "d": ("d_static_split", run.static_split),
        "e": ("e_memory", run.memory),
        "r": ("rounds", lambda: run.rounds(args.rounds)),
    }
    try:
        for key in args.phases:
            run.phase(*phases[key])
    finally:
        shutil.rmtree(run.tmp, ignore_errors=True)  # the servers' logs and the built artifact
    report(run.out)
    path = (
        args.out or RESULTS / f"many_models-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run.out, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
