"""The server against the model's own ceiling, side by side in one run on one machine.

ceiling: the raw model in N pinned processes (N = the cores, one thread each, the same
         runtime and precision), on the same texts, in batches sorted by length and padded only
         to their own longest. At concurrency C the texts are sorted within windows of C
         arriving texts (the most a server could see at once) and cut into batches by the
         fastest of several plans: greedily under each batch limit, or at the least cost (the
         server's own split) under each; the 256-text window is printed beside it as the
         absolute reference.
served:  the real `ringserve serve` with default options (plus the runtime and precision) on the
         same texts, one text per HTTP request, closed loop at concurrency 1, 32 and 64. The
         batch limit the server's own split runs fastest under is printed beside the defaults
         (they come from it).
Two mixes: short (SST-2 sentences) and long (AG News descriptions). Reports served/ceiling,
P50/P99, padding waste (from /v1/stats), whole-server CPU ms per request, and at concurrency 1 the
model's own batch-1 latency. Configurations: the defaults (ONNX Runtime fp32 on the graph
`--graph auto` picks at start), the other fp32 graph forced, TorchScript, int8 (the recipe
the artifact build chose; its frontier table, as the build measured it, is printed first),
int8-checked (its own int8 graph with fp32's second look at close calls; its ceiling runs the
same CheckedRunner), and bf16 on OpenVINO where the CPU has avx512_bf16 or amx_bf16 (in the
default --configs there only). Each server's whole process tree's PSS at start and after its
load. Then served figures divided by the fastest fp32 ceiling any graph reached, int8's,
int8-checked's and bf16's served speed over fp32's (the defaults', in the same run), and two
peers on the same texts: plain FastAPI (one text a forward pass) and LitServe with its own
batching. bf16 against fp32 at c=32 alone:
  python -m benchmarks.serving --configs default,bf16 --levels 32 --no-peer --skip-limits
int8-checked the same way: --configs default,int8,int8-checked.
Usage: python -m benchmarks.serving [--seconds 6] [--quick]
       [--configs default,other,torch,int8,int8-checked,bf16]
       [--mixes short,long] [--peers fastapi,litserve] [--no-peer] [--levels 1,32,64]
       [--skip-limits] [--skip-256] [--baseline OTHER_CHECKOUT --rounds N]
(a whole run takes about 15 minutes on 2 cores: --configs and --peers run it in parts).
--baseline serves another checkout (a main checkout, with its .typecheck links) and this one in
turns, `--rounds` times, each against ceilings measured beside it, and prints every round's
served/ceiling side by side: on a shared machine one run's ratio moves by 0.05 or more.
The column "model ms a text" is the workers' wall time in the model a request, served (from
/metrics) beside the ceiling's (its processes over its texts/s): where the two differ, the model
itself ran slower in the server (batch shapes, and the front-end's and client's work preempting
it on the same cores); the rest of the gap is CPU spent outside the model.
The column "steal %" is the share of the VM's CPU time the hypervisor took (/proc/stat's steal)
while the served load ran, beside its share while the ceiling ran: where they differ, the two
figures were measured on different machines in effect, and served/ceiling moves with it.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from ringserve.service.config.settings import CPU_MAX_BATCH, CPU_MAX_BATCH_TOKENS
from ringserve.workers.batches import BATCH_OVERHEAD, row_limit
from ringserve.workers.cpu import BF16_FLAGS, cpu_flags
from ringserve.workers.process.batcher import cheapest_split, runs

from benchmarks.int8_frontier import table
from benchmarks.memory import tree_pss
from devkit.http import HOST, classify_request, get_json, http_request
from devkit.launcher import AG_NEWS, ROOT, SST2, Launched, free_port, inherited_env, load_texts
from devkit.load import LoadResult, run_load
from devkit.models import raw_runner

MIXES = {"short": SST2, "long": AG_NEWS}
# (runtime, precision, graph): the default first ("auto": the server's choice, "other": the
# fp32 graph it did not choose, forced).
RUNTIMES = [
    ("onnx", "fp32", "auto"),
    ("onnx", "fp32", "other"),
    ("torch", "fp32", ""),
    ("onnx", "int8", ""),
    ("onnx", "int8-checked", ""),
    ("openvino", "bf16", ""),
]
# --configs, in RUNTIMES' order
CONFIG_NAMES = ("default", "other", "torch", "int8", "int8-checked", "bf16")
# the faster precisions whose served speed the summary sets over fp32's
FAST = (("onnx", "int8"), ("onnx", "int8-checked"), ("openvino", "bf16"))
# bf16 is served on a CPU with one of these (workers/cpu.py BF16_FLAGS), else refused
CPU_BF16 = bool(cpu_flags() & set(BF16_FLAGS))
LEVELS = [1, 32, 64]
# Batch limits the ceiling tries: (rows, padded tokens).
LIMITS = [(8, 256), (16, 256), (32, 512), (64, 512), (64, 1024)]
Batch = list[list[int]]  # token ids of each text


# -- the ceiling: pinned processes running planned batches -----------------------------------------
def _ceiling_loop(conn: Any, cpu: int) -> None:
    os.sched_setaffinity(0, [cpu])
    from ringserve.workers.batches import Item

    runner: Any = None
    while True:
        msg = conn.recv()
        if msg[0] == "load":
            _, model_dir, runtime, precision, graph = msg
            runner = raw_runner(model_dir, runtime, precision, 256, graph or "plain")
            runner.warm()
            conn.send("ok")
        elif msg[0] == "run":
            _, batches, seconds = msg
            conn.send(_run_batches(runner, [[Item(0, 0, 0, ids) for ids in b] for b in batches],
                                   seconds))  # fmt: skip
        else:
            return


def _run_batches(runner: Any, batches: list[list[Any]], seconds: float) -> tuple[int, float, float]:
    """Texts done, seconds taken, median seconds a batch: whole passes, until `seconds` pass."""
    done, times = 0, []
    t0 = time.perf_counter()
    while not times or time.perf_counter() - t0 < seconds:
        for batch in batches:
            b0 = time.perf_counter()
            length = max(len(it.ids) for it in batch)
            runner.fill(length, batch)
            runner.forward(length, len(batch))
            times.append(time.perf_counter() - b0)
            done += len(batch)
    return done, time.perf_counter() - t0, statistics.median(times)


class CeilingPool:
    """One pinned process per worker; each runs its share of the planned batches."""

    def __init__(self, workers: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        cpus = sorted(os.sched_getaffinity(0))
        self.conns = []
        self.procs = []
        for k in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_ceiling_loop, args=(child, cpus[k % len(cpus)]))
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def load(self, model_dir: str, runtime: str, precision: str, graph: str = "plain") -> None:
        for c in self.conns:
            c.send(("load", model_dir, runtime, precision, graph))
        for c in self.conns:
            c.recv()

    def run(self, batches: list[Batch], seconds: float) -> tuple[float, float]:
        """Texts/s of all processes together, and the median batch time (s). Batches are dealt
        round robin, as workers sharing one queue would take them."""
        n = len(self.conns)
        for k, c in enumerate(self.conns):
            c.send(("run", batches[k::n] or batches[:1], seconds))
        results = [c.recv() for c in self.conns]
        rate = sum(done / took for done, took, _ in results)
        return rate, statistics.median(r[2] for r in results)

    def latency(self, batches: list[Batch], seconds: float) -> float:
        """Median seconds a batch on one process while the others idle (a served text at
        concurrency 1 has the machine to itself, and two vCPUs may share one core)."""
        self.conns[0].send(("run", batches, seconds))
        return float(self.conns[0].recv()[2])

    def close(self) -> None:
        for c in self.conns:
            c.send(("stop",))
        for p in self.procs:
            p.join(10)


def plan(
    encodings: list[list[int]],
    window: int,
    max_batch: int,
    max_tokens: int,
    overhead: int | None = None,
) -> list[Batch]:
    """Batches as a server seeing `window` arriving texts at once could form them: each window
    sorted by length, padded to each batch's longest, cut under the limit either greedily
    (overhead None: as full as the limit allows) or at the least total cost, a batch costing
    its padded tokens plus `overhead` (the server's own split, workers/process/batcher.py)."""
    batches: list[Batch] = []
    for start in range(0, len(encodings), window):
        chunk = sorted(encodings[start : start + window], key=len)
        if overhead is not None:
            cut = cheapest_split([len(e) for e in chunk], max_batch, max_tokens, overhead)
            batches += [chunk[i:j] for i, j in runs(cut)]
            continue
        i = 0
        while i < len(chunk):
            j = i + 1
            while j < len(chunk) and row_limit(len(chunk[j]), max_batch, max_tokens) > j - i:
                j += 1
            batches.append(chunk[i:j])
            i = j
    return batches


def candidates(encodings: list[list[int]], window: int, overhead: int) -> dict[str, list[Batch]]:
    """Every plan the ceiling tries at a window: greedy and least-cost cuts under each limit."""
    if window == 1:
        return {"one text a batch": plan(encodings, 1, 1, 1)}
    out = {}
    for rows, tokens in LIMITS:
        out[f"greedy {rows}/{tokens}"] = plan(encodings, window, rows, tokens)
        out[f"cheapest {rows}/{tokens}"] = plan(encodings, window, rows, tokens, overhead)
    return out


def best_plan(
    pool: CeilingPool, encodings: list[list[int]], window: int, overhead: int, seconds: float
) -> tuple[str, list[Batch]]:
    """The fastest of the candidate plans at this window, each run for `seconds`."""
    plans = candidates(encodings, window, overhead)
    if len(plans) == 1:
        return next(iter(plans.items()))
    rates = {name: pool.run(batches, seconds)[0] for name, batches in plans.items()}
    name = max(rates, key=lambda n: rates[n])
    return name, plans[name]


def ceiling(
    texts: list[str],
    runtime: str = "onnx",
    precision: str = "fp32",
    workers: int = 2,
    window: int = 256,
    limit: tuple[int, int] = (CPU_MAX_BATCH, CPU_MAX_BATCH_TOKENS),
    seconds: float = 3.0,
    model_dir: str | None = None,
    pool: CeilingPool | None = None,
) -> float:
    """Texts/s of the model alone on `texts` (the ceiling any server of `workers` pinned
    1-thread processes can reach): sorted within windows of `window` texts, batches of at most
    limit = (rows, padded tokens), cut greedily or at the least cost, whichever runs faster.
    Importable: `ringserve batch`'s benchmark uses it too."""
    from ringserve.factory.build import default_artifact_dir
    from ringserve.workers.artifact import load_manifest, load_tokenizer

    model_dir = model_dir or str(default_artifact_dir())
    tok = load_tokenizer(model_dir, load_manifest(model_dir).max_length)
    encodings = [e.ids for e in tok.encode_batch(texts)]
    overhead = BATCH_OVERHEAD[runtime, precision]
    own = pool is None
    pool = pool or CeilingPool(workers)
    try:
        if own:
            pool.load(model_dir, runtime, precision)
        plans = [plan(encodings, window, *limit), plan(encodings, window, *limit, overhead)]
        return max(pool.run(batches, seconds)[0] for batches in plans)
    finally:
        if own:
            pool.close()


# -- served ----------------------------------------------------------------------------------------
def tree_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of the server and every process under it (workers, zygote), and of the
    front-end process alone (its event loop, parsers and the supervisor)."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total, front = 0.0, 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
        if p.pid == pid:
            front = t.user + t.system
    return total, front


@dataclass
class Served:
    load: LoadResult
    waste: float
    cpu_ms: float
    front_ms: float = float("nan")  # the front-end process's CPU ms a request
    client_ms: float = float("nan")  # the load generator's, on the same cores
    model_ms: float = float("nan")  # the workers' time in the model a request (wall)
    runs: list[float] = field(default_factory=list)  # req/s of each run (best_served)


def cpu_jiffies() -> tuple[int, int]:
    """The machine's stolen and total CPU time so far, in clock ticks (/proc/stat's cpu line:
    user nice system idle iowait irq softirq steal)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    return ticks[7], sum(ticks)


def steal_pct(*spans: tuple[int, int]) -> float:
    """Percent of the CPU time stolen over the spans between consecutive pairs of readings
    (a, b, c, d: a to b and c to d)."""
    stolen = sum(b[0] - a[0] for a, b in zip(spans[::2], spans[1::2], strict=True))
    total = sum(b[1] - a[1] for a, b in zip(spans[::2], spans[1::2], strict=True))
    return 100 * stolen / total if total else float("nan")


def model_busy_s(port: int) -> float:
    """Seconds the workers spent in the model so far (/metrics)."""
    body = http_request(port, "GET", "/metrics")[2].decode()
    for line in body.splitlines():
        if line.startswith("ringserve_model_busy_seconds_total"):
            return float(line.split()[-1])
    return float("nan")


def serve_level(
    port: int, pid: int, texts: list[str], c: int, seconds: float, stats: bool = True
) -> Served:
    """Closed-loop load at concurrency `c` after a 1 s warm-up; padding waste from /v1/stats
    (`stats`: ringserve has it, the peer does not)."""
    import uvloop

    requests = [classify_request(t) for t in texts]
    uvloop.run(run_load(port, requests, c, 1.0, warmup_s=0))
    before = get_json(port, "/v1/stats")["totals"] if stats else {}
    busy0 = model_busy_s(port) if stats else float("nan")
    cpu0 = tree_cpu_s(pid)
    client0 = time.process_time()
    result = uvloop.run(run_load(port, requests, c, seconds, warmup_s=0))
    cpu1 = tree_cpu_s(pid)
    client = time.process_time() - client0
    ok = max(1, result.ok)
    waste = float("nan")
    busy = float("nan")
    if stats:
        busy = (model_busy_s(port) - busy0) * 1000 / ok
        after = get_json(port, "/v1/stats")["totals"]
        padded = after["padded_tokens"] - before["padded_tokens"]
        waste = 1 - (after["tokens"] - before["tokens"]) / padded if padded else 0.0
    front = (cpu1[1] - cpu0[1]) * 1000 / ok
    return Served(result, waste, (cpu1[0] - cpu0[0]) * 1000 / ok, front, client * 1000 / ok, busy)


def best_served(
    port: int, pid: int, texts: list[str], c: int, args: argparse.Namespace, stats: bool = True
) -> Served:
    """serve_level `args.served_runs` times in a row, the fastest kept. What disturbs a shared
    VM (steal, a neighbour) only ever slows a run down, so the best of several runs is the
    estimate of a capacity; the ceiling is the best of two (serve_and_ceiling), and the served
    figures, ours and the peers', are taken the same way so that neither side of a ratio gets
    more draws than the other."""
    runs = [serve_level(port, pid, texts, c, args.seconds, stats) for _ in range(args.served_runs)]
    best = max(runs, key=lambda r: r.load.rps)
    best.runs = [r.load.rps for r in runs]
    return best


# -- the peers -------------------------------------------------------------------------------------
class Peer:
    """A peer server in a session of its own (stopped with its process group): benchmarks/peer.py
    under uvicorn (`fastapi`: `workers` processes, one thread each, one text a forward pass) or
    benchmarks/litserve_peer.py (`litserve`: 2 inference workers of 1 thread, its own batching,
    model.onnx), both on the same artifact."""

    def __init__(self, kind: str, workers: int, runtime: str, precision: str) -> None:
        self.port = free_port()
        env = {**inherited_env(), "OMP_NUM_THREADS": "1"}
        env |= {"RINGSERVE_PEER_RUNTIME": runtime, "RINGSERVE_PEER_PRECISION": precision}
        if kind == "fastapi":
            cmd = ["-m", "uvicorn", "benchmarks.peer:app", "--host", HOST, "--port",
                   str(self.port), "--workers", str(workers), "--log-level", "warning",
                   "--no-access-log"]  # fmt: skip
        else:
            cmd = ["-m", "benchmarks.litserve_peer", "--port", str(self.port), "--workers",
                   str(workers)]  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, *cmd], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float = 120.0) -> None:
        # LitServe answers /health with a plain "ok", FastAPI with JSON: the status is read
        wait_health(self.proc, self.port, "the peer", timeout)

    def close(self) -> None:
        stop_group(self.proc)


def wait_health(
    proc: subprocess.Popen[Any],
    port: int,
    what: str,
    timeout: float,
    log_tail: Callable[[], str] | None = None,
    path: str = "/health",
) -> None:
    """Poll a peer's GET `path` until it answers 200; an exit first is an error naming `what`
    (with `log_tail()` when given), as is no answer within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = f":\n{log_tail()}" if log_tail is not None else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}{tail}")
        with contextlib.suppress(OSError):
            if http_request(port, "GET", path, timeout=2.0)[0] == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not answer {path} in {timeout} s")


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to a peer started in its own session (its whole process group), SIGKILL after
    30 s, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


PEERS = {
    "fastapi": "FastAPI under uvicorn, {w} workers x 1 thread, one text a forward pass",
    "litserve": "LitServe with its own batching (up to 32 texts, 5 ms), {w} workers x 1 thread",
}


def run_peer(
    args: argparse.Namespace, texts: dict[str, list[str]], ours: dict[tuple[str, int], Level]
) -> None:
    runtime, precision, _ = RUNTIMES[0]
    for kind, what in PEERS.items():
        if kind not in args.peers:
            continue
        print(f"\nthe peer: {what.format(w=args.cores)}, {runtime} {precision} model.onnx "
              "(the same model and runtime as ringserve's defaults):")  # fmt: skip
        print("| mix | c | ringserve/s | peer/s | ringserve/peer | P50 ms ringserve / peer | "
              "P99 ms ringserve / peer | CPU ms/req ringserve / peer |")  # fmt: skip
        print("| --- " * 8 + "|")
        peer = Peer(kind, args.cores, runtime, precision)
        try:
            peer.wait_ready()
            for mix in args.mixes:
                for c in args.levels:
                    p = best_served(peer.port, peer.pid, texts[mix], c, args, stats=False)
                    r = ours[mix, c].served
                    print(f"| {mix} | {c} | {r.load.rps:.1f} | {p.load.rps:.1f} | "
                          f"{r.load.rps / p.load.rps:.2f} | {r.load.pct(50):.1f} / "
                          f"{p.load.pct(50):.1f} | {r.load.pct(99):.1f} / "
                          f"{p.load.pct(99):.1f} | {r.cpu_ms:.1f} / {p.cpu_ms:.1f} |",
                          flush=True)  # fmt: skip
            print(f"{kind}'s process tree PSS after its load: "
                  f"{tree_pss(peer.pid)['tree']:.0f} MiB")  # fmt: skip
        finally:
            peer.close()


# -- the run ---------------------------------------------------------------------------------------
def best_limit(pool: CeilingPool, encs: dict[str, list[list[int]]], seconds: float) -> None:
    """The batch limit the server's own split runs fastest under at the 256 window; the
    defaults come from it (printed beside them; the served runs use the defaults)."""
    overhead = BATCH_OVERHEAD[RUNTIMES[0][:2]]
    print("batch limit at the 256 window, the server's own split (default runtime), texts/s:")
    scores = {}
    for limit in LIMITS:
        rates = {m: pool.run(plan(e, 256, *limit, overhead), seconds)[0] for m, e in encs.items()}
        scores[limit] = statistics.geometric_mean(rates.values())
        print(f"  {limit[0]:>3} rows, {limit[1]:>5} tokens: "
              + "  ".join(f"{m} {r:7.1f}" for m, r in rates.items()))  # fmt: skip
    best = max(scores, key=lambda limit: scores[limit])
    default = (CPU_MAX_BATCH, CPU_MAX_BATCH_TOKENS)
    at = scores[default] / scores[best] if default in scores else float("nan")
    print(f"  best (geometric mean of the mixes): {best[0]} rows, {best[1]} tokens; the defaults, "
          f"{default[0]} rows and {default[1]} tokens, reach {at:.3f} of it")  # fmt: skip


@dataclass
class Level:
    served: Served
    ceiling: float  # texts/s of the model alone at this level's window


def run_config(
    args: argparse.Namespace,
    pool: CeilingPool,
    model_dir: str,
    texts: dict[str, list[str]],
    encs: dict[str, list[list[int]]],
    config: tuple[str, str, str],
    tree: Path | None = None,
    label: str = "",
) -> tuple[str, dict[tuple[str, int], Level]]:
    """One configuration served (by another checkout's server when `tree` is given: a
    baseline, named `label` in the rows) and measured against its own ceiling at every level;
    returns the fp32 graph it served ("" for TorchScript, int8 and bf16) and its levels."""
    runtime, precision, graph = config
    overhead = BATCH_OVERHEAD[runtime, precision]
    levels = {}
    extra = ["--runtime", runtime, "--precision", precision]
    if args.workers is not None:  # else the server's own layout (its defaults are measured)
        extra += ["--workers", str(args.workers)]
    if graph:
        extra += ["--graph", graph]
    with tempfile.TemporaryDirectory(prefix="ringserve-serving-") as tmp:
        srv = Launched(tmp, [*extra, *args.server_args.split()], binary=False, tree=tree)
        try:
            wait_cores(srv)
            served_graph = get_json(srv.port, "/v1/model").get("graph", {}).get("graph", "")
            pool.load(model_dir, runtime, precision, served_graph)
            start_pss = settled_pss(srv)
            name = f"{runtime} {precision}{f' {served_graph}' if served_graph else ''}"
            name = f"{label}: {name}" if label else name
            for mix in args.mixes:
                for c in args.levels:
                    levels[mix, c] = serve_and_ceiling(args, pool, srv, mix, c, texts, encs,
                                                       overhead, name)  # fmt: skip
            after = tree_pss(srv.pid)["tree"]
            print(f"| {name}: the process tree's PSS {start_pss:.0f} MiB at start, "
                  f"{after:.0f} MiB after the load |" + " |" * 16, flush=True)  # fmt: skip
        finally:
            srv.terminate()
    return served_graph, levels


def wait_cores(srv: Launched, timeout: float = 180.0) -> None:
    """Wait until the ready workers hold every core between them (two workers of one lane, or
    one of two: whatever layout the server chose)."""
    srv.wait_ready(None, timeout)
    cores = set(os.sched_getaffinity(0))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = [w for w in srv.ctl({"cmd": "status"})["workers"] if w["state"] == "ready"]
        if cores <= {c for w in ready for c in w["cpus"]}:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the server's ready workers did not cover the cores in {timeout} s")


def settled_pss(srv: Launched, timeout: float = 60.0) -> float:
    """The tree's PSS (MiB) once every worker and spare is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [w["state"] for w in srv.ctl({"cmd": "status"})["workers"]]
        if states and all(s in ("ready", "spare") for s in states):
            break
        time.sleep(0.1)
    return tree_pss(srv.pid)["tree"]


def serve_and_ceiling(
    args: argparse.Namespace,
    pool: CeilingPool,
    srv: Launched,
    mix: str,
    c: int,
    texts: dict[str, list[str]],
    encs: dict[str, list[list[int]]],
    overhead: int,
    name: str,
) -> Level:
    ref = float("nan")
    if not args.skip_256:
        _, top = best_plan(pool, encs[mix], 256, overhead, args.search_seconds)
        ref, _ = pool.run(top, args.ceiling_seconds)
    # The machine is shared: the ceiling is taken before and after the served run and the
    # higher one kept; the served load runs --served-runs times between them and its best is
    # kept too (best_served).
    plan_name, batches = best_plan(pool, encs[mix], c, overhead, args.search_seconds)
    t0 = cpu_jiffies()
    ceil, batch_s = pool.run(batches, args.ceiling_seconds)
    t1 = cpu_jiffies()
    s = best_served(srv.port, srv.pid, texts[mix], c, args)
    t2 = cpu_jiffies()
    again, batch_again = pool.run(batches, args.ceiling_seconds)
    t3 = cpu_jiffies()
    steal_ceiling = steal_pct(t0, t1, t2, t3)
    ceil, batch_s = max(ceil, again), min(batch_s, batch_again)
    if c == 1:
        batch_s = pool.latency(batches, args.ceiling_seconds)
    b1 = f"{batch_s * 1000:.1f}" if c == 1 else "-"
    print(
        f"| {mix} | {name} | {c} | {s.load.rps:.1f} ({' / '.join(f'{r:.0f}' for r in s.runs)}) "
        f"| {ceil:.1f} | "
        f"{plan_name} | {s.load.rps / ceil:.2f} | {ref:.1f} | {s.load.pct(50):.1f} | "
        f"{s.load.pct(99):.1f} | {b1} | {s.waste:.2f} | {s.cpu_ms:.1f} | {s.front_ms:.2f} | "
        f"{s.client_ms:.2f} | {s.model_ms:.2f} / {len(pool.conns) * 1000 / ceil:.2f} | "
        f"{steal_pct(t1, t2):.1f} / {steal_ceiling:.1f} |",
        flush=True,
    )
    return Level(s, ceil)


def summary(results: dict[tuple[str, str, str], dict[tuple[str, int], Level]]) -> None:
    """The defaults' served figures over the fastest fp32 ceiling found (any graph or runtime),
    and int8's, int8-checked's and bf16's served speed over the defaults' (fp32), all from this
    run."""
    if RUNTIMES[0] not in results:
        return
    default = results[RUNTIMES[0]]
    fp32 = [levels for config, levels in results.items() if config[1] == "fp32"]
    fast = [(p, results.get((r, p, ""))) for r, p in FAST]
    print("\n| mix | c | served/s (defaults) | fastest fp32 ceiling/s | served/fastest | "
          + " | ".join(f"{p} served/s | {p}/fp32 served" for p, _ in fast) + " |")  # fmt: skip
    print("| --- " * (5 + 2 * len(fast)) + "|")
    for mix, c in default:
        best = max(levels[mix, c].ceiling for levels in fp32)
        rps = default[mix, c].served.load.rps
        cells = []
        for _, levels in fast:
            got = levels[mix, c].served.load.rps if levels else float("nan")
            cells.append(f"{got:.1f} | {got / rps:.2f}")
        print(f"| {mix} | {c} | {rps:.1f} | {best:.1f} | {rps / best:.2f} | "
              + " | ".join(cells) + " |")  # fmt: skip


def options(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[tuple[str, str, str]]]:
    """The command line, and the configurations it serves, in RUNTIMES' order."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=6.0, help="served load per level")
    p.add_argument(
        "--served-runs", type=int, default=2, help="served runs a level, the fastest kept"
    )
    p.add_argument(
        "--ceiling-seconds",
        type=float,
        help="per ceiling figure (default: --seconds, as long as a served draw)",
    )
    p.add_argument("--search-seconds", type=float, default=0.6, help="per plan tried")
    p.add_argument(
        "--workers",
        type=int,
        help="--workers for the server (default: its own layout); the ceiling and the peers "
        "run one process per core",
    )
    p.add_argument("--texts", type=int, default=1000, help="texts per mix")
    p.add_argument("--quick", action="store_true", help="default runtime only")
    p.add_argument("--server-args", default="", help="extra `ringserve serve` options")
    p.add_argument("--no-peer", action="store_true", help="skip the peers")
    p.add_argument(
        "--configs",
        default=",".join(n for n in CONFIG_NAMES if n != "bf16" or CPU_BF16),
        help=f"which of {', '.join(CONFIG_NAMES)} to serve (other, peers: default too; bf16 "
        "by default only on a CPU that has it)",
    )
    p.add_argument("--skip-limits", action="store_true", help="skip the batch-limit search")
    p.add_argument("--skip-256", action="store_true", help="skip the 256-window reference")
    p.add_argument("--mixes", default=",".join(MIXES), help="short, long or both")
    p.add_argument("--peers", default=",".join(PEERS), help="fastapi, litserve or both")
    p.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrencies")
    p.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. main's): its server and this one's take turns, the "
        "default configuration only, each against its own ceilings (no peers)",
    )
    p.add_argument("--rounds", type=int, default=1, help="turns of each with --baseline")
    args = p.parse_args(argv)
    # A ceiling draw runs as long as a served one: the best of short windows beats the best of
    # long ones on a shared VM (docs/design.md, "How the serving benchmark draws").
    if args.ceiling_seconds is None:
        args.ceiling_seconds = args.seconds
    args.levels = [int(c) for c in args.levels.split(",")]
    args.cores = len(os.sched_getaffinity(0))
    args.mixes = [m for m in MIXES if m in args.mixes.split(",")]
    args.peers = [] if args.no_peer else args.peers.split(",")
    wanted = {"default"} if args.quick else set(args.configs.split(","))
    if wanted & {"other"} or args.peers:  # both are defined by the defaults' run
        wanted.add("default")
    configs = [c for c, name in zip(RUNTIMES, CONFIG_NAMES, strict=True) if name in wanted]
    if args.baseline is not None:
        configs, args.peers = [RUNTIMES[0]], []
    return args, configs


def main(argv: list[str] | None = None) -> int:
    args, configs = options(argv)
    from ringserve.factory.build import default_artifact_dir
    from ringserve.workers.artifact import load_manifest, load_tokenizer

    model_dir = str(default_artifact_dir())
    manifest = load_manifest(model_dir)
    texts = {m: load_texts(path, args.texts) for m, path in MIXES.items()}
    tok = load_tokenizer(model_dir, manifest.max_length)
    encs = {m: [e.ids for e in tok.encode_batch(t)] for m, t in texts.items()}
    for m, e in encs.items():
        print(f"{m}: {len(e)} texts, {statistics.mean(map(len, e)):.1f} tokens on average")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cpus, flags {simd_flags()}, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB; load average "
          f"{os.getloadavg()[0]:.1f}; ceiling and peers: {args.cores} processes x 1 thread; "
          f"ringserve: {args.workers or 'default'} workers")  # fmt: skip
    table(f"int8 frontier of {manifest.name}, measured at its build", manifest)
    print(f"  fused fp32 graph: {manifest.graphs.get('fused')}\n")
    t0 = time.monotonic()
    pool = CeilingPool(args.cores)
    results = {}
    try:
        pool.load(model_dir, *RUNTIMES[0][:2])
        if not args.skip_limits:
            best_limit(pool, encs, args.ceiling_seconds)
        print("| mix | runtime | c | served/s (each run) | ceiling/s (window c) | ceiling's plan | "
              "served/ceiling | ceiling/s (window 256) | P50 ms | P99 ms | model batch-1 ms | "
              "padding waste | server CPU ms/req | front-end CPU ms/req | "
              "client CPU ms/req | model ms a text, served / ceiling | "
              "steal %, served / ceiling |")  # fmt: skip
        print("| --- " * 17 + "|")
        if args.baseline is not None:
            return turns(args, pool, model_dir, texts, encs)
        chosen = "plain"
        for config in configs:
            if config[2] == "other":
                config = (config[0], config[1], "fused" if chosen == "plain" else "plain")
            graph, results[config] = run_config(args, pool, model_dir, texts, encs, config)
            chosen = graph if config == RUNTIMES[0] else chosen
    finally:
        pool.close()
    summary(results)
    if args.peers:
        run_peer(args, texts, results[RUNTIMES[0]])
    print(f"took {time.monotonic() - t0:.0f} s")
    return 0


def turns(
    args: argparse.Namespace,
    pool: CeilingPool,
    model_dir: str,
    texts: dict[str, list[str]],
    encs: dict[str, list[list[int]]],
) -> int:
    """--baseline: the baseline's server and this checkout's take turns, `rounds` times, each
    against ceilings measured beside it, first in turn; then each one's served/ceiling in every
    round."""
    ratios: dict[tuple[str, str, int], list[float]] = {}
    p50s: dict[tuple[str, str, int], list[float]] = {}
    pair: list[tuple[str, Path | None]] = [("baseline", args.baseline), ("this", None)]
    for r in range(args.rounds):  # each goes first in every other round: the machine drifts
        for label, tree in pair if r % 2 == 0 else pair[::-1]:
            _, levels = run_config(args, pool, model_dir, texts, encs, RUNTIMES[0], tree, label)
            for (mix, c), level in levels.items():
                ratios.setdefault((label, mix, c), []).append(level.served.load.rps / level.ceiling)
                p50s.setdefault((label, mix, c), []).append(level.served.load.pct(50))
    print("\n| mix | c | served/ceiling, baseline | served/ceiling, this | P50 ms, baseline | "
          "P50 ms, this |")  # fmt: skip
    print("| --- " * 6 + "|")
    for mix in args.mixes:
        for c in args.levels:
            cells = [
                ", ".join(f"{v:.3f}" for v in ratios[who, mix, c]) for who in ("baseline", "this")
            ]
            cells += [
                ", ".join(f"{v:.1f}" for v in p50s[who, mix, c]) for who in ("baseline", "this")
            ]
            print(f"| {mix} | {c} | " + " | ".join(cells) + " |")
    return 0


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def simd_flags() -> str:
    """The instruction sets that decide which graph and which int8 kernels are fastest."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
            return " ".join(f for f in wanted if f in have) or "none of AVX2/AVX-512/VNNI"
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
