"""Load generator over a memory-mapped corpus: open loop (fixed-rate or Poisson) or closed loop.

Open loop: requests start at their scheduled times whatever the server does, so a slow server
meets a queue, not a politely waiting client; latency is measured from the scheduled time (no
coordinated omission). Every request is recorded (scheduled and answer time, status, protocol,
length bucket); the report gives achieved against offered rate, P50/P99/P99.9 per length bucket
and errors by kind. The server's RSS and PSS (front-end and workers, from /proc) and, on CUDA,
NVML's device memory are sampled every second; memory fluctuation is (max-min)/mean after the
warm-up.

  python -m benchmarks.loadgen --corpus C --rate 70 --duration 600 --protocol http,binary \
      --launch "--workers 2"            # or --port/--binary-port/--server-pid of a running one
  python -m benchmarks.loadgen --corpus C --closed 32 --duration 15 --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.service.offline.corpus import Corpus
from ringserve.wire import frames as wire

from devkit.http import HttpConn, get_json, http_message
from devkit.launcher import Launched
from devkit.load import percentile, run_load

TOKEN_BUCKETS = (16, 32, 64, 128, 256)  # a request's bucket: the first bound >= its tokens
PROTOCOLS = ("http", "kserve", "binary")
MAX_HTTP_CONNS = 512  # open loop on HTTP/1.1 needs a connection per outstanding request
NO_ANSWER, CONN_ERROR, CLIENT_FULL = -3, -1, -2
BINARY_BASE = 1000  # binary statuses are recorded as 1000 + the wire status
IDLE_S = 20.0  # an idle HTTP connection is closed after this (the server's keep-alive: 60 s)


# -- texts ----------------------------------------------------------------------------------------
class Texts:
    """Valid records of a corpus, their token-length buckets, read through the mmap when sent."""

    def __init__(self, path: str, model_dir: str, limit: int) -> None:
        from ringserve.workers.artifact import load_manifest, load_tokenizer

        self.corpus = Corpus(path)
        manifest = load_manifest(model_dir)
        tok = load_tokenizer(model_dir, manifest.max_length)
        rows: list[int] = []
        buckets: list[int] = []
        chunk: list[tuple[int, str]] = []
        for i, (_tag, raw) in enumerate(self.corpus.walk()):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip():
                chunk.append((i, text))
            if len(chunk) == 2048 or (i == len(self.corpus) - 1 and chunk):
                self._bucket(tok, chunk, rows, buckets)
                chunk = []
            if len(rows) >= limit:
                break
        if chunk:
            self._bucket(tok, chunk, rows, buckets)
        if not rows:
            raise SystemExit(f"{path}: no valid texts")
        self.rows = np.array(rows, np.int64)
        self.buckets = np.array(buckets, np.uint8)
        self.corpus.release()

    @staticmethod
    def _bucket(tok: Any, chunk: list[tuple[int, str]], rows: list[int], out: list[int]) -> None:
        for (i, _), enc in zip(chunk, tok.encode_batch([t for _, t in chunk]), strict=True):
            rows.append(i)
            out.append(min(np.searchsorted(TOKEN_BUCKETS, len(enc.ids)), len(TOKEN_BUCKETS) - 1))

    def __len__(self) -> int:
        return len(self.rows)

    def text(self, k: int) -> bytes:
        return self.corpus.raw(int(self.rows[k % len(self.rows)]))

    def bucket(self, k: int) -> int:
        return int(self.buckets[k % len(self.rows)])


# -- records --------------------------------------------------------------------------------------
@dataclass
class Records:
    """One row per request, preallocated: nothing grows while the load runs."""

    n: int
    sched: np.ndarray = field(init=False)  # scheduled send, ns since the run's start
    sent: np.ndarray = field(init=False)
    done: np.ndarray = field(init=False)
    status: np.ndarray = field(init=False)
    bucket: np.ndarray = field(init=False)
    proto: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.sched = np.zeros(self.n, np.int64)
        self.sent = np.zeros(self.n, np.int64)
        self.done = np.zeros(self.n, np.int64)
        self.status = np.full(self.n, NO_ANSWER, np.int32)
        self.bucket = np.zeros(self.n, np.uint8)
        self.proto = np.zeros(self.n, np.uint8)


def arrival_times(rate: float, duration: float, poisson: bool, seed: int = 1) -> np.ndarray:
    """Scheduled send times in seconds from the start."""
    if not poisson:
        return np.arange(0.0, duration, 1.0 / rate)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, int(rate * duration * 1.2) + 100)
    times = np.cumsum(gaps)
    return times[times < duration]


# -- protocols ------------------------------------------------------------------------------------
class HttpSender:
    """HTTP/1.1 /v1/classify or KServe infer: a pool of keep-alive connections, one per request."""

    def __init__(self, port: int, kserve_model: str | None, idle_s: float = IDLE_S) -> None:
        self.port = port
        self.kserve_model = kserve_model
        self.idle: list[tuple[HttpConn, float]] = []  # with the time each went idle
        self.idle_s = idle_s
        self.open = 0

    def request(self, text: bytes) -> bytes:
        s = text.decode("utf-8")
        if self.kserve_model is None:
            return http_message("POST", "/v1/classify", json.dumps({"text": s}).encode())
        doc = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [s]}]}
        path = f"/v2/models/{self.kserve_model}/infer"
        return http_message("POST", path, json.dumps(doc).encode())

    def take(self) -> HttpConn | None:
        """The most recently used idle connection, after closing any that idled so long the
        server may be closing them (its keep-alive timeout): a request sent on one of those is
        lost to the race, which a measurement must not count against the server."""
        now = time.monotonic()
        fresh = [(c, t) for c, t in self.idle if now - t < self.idle_s]
        for c, t in self.idle:
            if now - t >= self.idle_s:
                c.close()
                self.open -= 1
        self.idle = fresh
        return self.idle.pop()[0] if self.idle else None

    async def send(self, rec: Records, k: int, text: bytes, t0: int) -> None:
        conn = self.take()
        if conn is None:
            if self.open >= MAX_HTTP_CONNS:
                rec.status[k] = CLIENT_FULL
                return
            self.open += 1
            try:
                conn = await HttpConn.open(self.port)
            except OSError:
                self.open -= 1
                rec.status[k] = CONN_ERROR
                return
        req = self.request(text)
        rec.sent[k] = time.monotonic_ns() - t0
        try:
            answer = await conn.send(req)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            rec.status[k] = CONN_ERROR
            conn.close()
            self.open -= 1
            return
        rec.done[k] = time.monotonic_ns() - t0
        rec.status[k] = answer.status
        if conn.closed:
            self.open -= 1
        else:
            self.idle.append((conn, time.monotonic()))

    def close(self) -> None:
        for c, _ in self.idle:
            c.close()


class BinarySender:
    """The framed binary protocol: one pipelined connection, answers matched by tag."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None
        self.rec: Records | None = None
        self.t0 = 0

    async def start(self, rec: Records, t0: int) -> None:
        reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.rec, self.t0 = rec, t0
        self.reader_task = asyncio.create_task(self.read(reader))

    async def read(self, reader: asyncio.StreamReader) -> None:
        parser = wire.AnswerParser()
        rec = self.rec
        assert rec is not None
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            now = time.monotonic_ns() - self.t0
            for a in parser.feed(data):
                rec.done[a.tag] = now
                rec.status[a.tag] = BINARY_BASE + a.status

    async def send(self, rec: Records, k: int, text: bytes, t0: int) -> None:
        assert self.writer is not None
        rec.sent[k] = time.monotonic_ns() - t0
        try:
            self.writer.write(wire.encode_frame(text, k))
        except (OSError, RuntimeError):
            rec.status[k] = CONN_ERROR

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.reader_task is not None:
            self.reader_task.cancel()


# -- memory ---------------------------------------------------------------------------------------
def proc_tree(pid: int) -> list[int]:
    import psutil

    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def rss_pss(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes from /proc/PID/smaps_rollup; (0, 0) when the process is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


class MemorySampler(threading.Thread):
    """Every second: the server's total RSS and PSS (front-end + workers) and NVML memory."""

    def __init__(self, pid: int, every_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.every_s = every_s
        self.samples: list[dict[str, float]] = []
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()
        self.gpus = self._gpus()

    @staticmethod
    def _gpus() -> list[Any]:
        from ringserve.workers.runtimes import nvml

        lib = nvml.default()
        return [lib.handle(i) for i in range(lib.device_count())]

    def sample(self) -> dict[str, float]:
        pids = proc_tree(self.pid)
        pairs = [rss_pss(p) for p in pids]
        row = {
            "t": time.monotonic() - self.t0,
            "rss": float(sum(r for r, _ in pairs)),
            "pss": float(sum(p for _, p in pairs)),
            "front_rss": float(pairs[0][0]) if pairs else 0.0,
            "processes": float(len(pids)),
        }
        if self.gpus:
            from ringserve.workers.runtimes import nvml

            used = [nvml.default().sample(h) for h in self.gpus]
            row["gpu_mem"] = float(sum(s.mem_used for s in used if s is not None))
        return row

    def run(self) -> None:
        while not self.stop_event.wait(self.every_s):
            self.samples.append(self.sample())

    def stop(self) -> None:
        self.stop_event.set()
        self.join(5)

    def fluctuation(self, key: str, after_s: float) -> dict[str, float]:
        xs = [s[key] for s in self.samples if s["t"] >= after_s and key in s]
        if not xs:
            return {}
        mean = sum(xs) / len(xs)
        return {
            "min_mib": min(xs) / 2**20,
            "max_mib": max(xs) / 2**20,
            "mean_mib": mean / 2**20,
            "fluctuation": (max(xs) - min(xs)) / mean if mean else float("nan"),
            "samples": len(xs),
        }


# -- the open loop --------------------------------------------------------------------------------
async def open_loop(
    texts: Texts, senders: list[Any], times: np.ndarray, drain_s: float
) -> tuple[Records, int]:
    rec = Records(len(times))
    sched_ns = (times * 1e9).astype(np.int64)
    rec.sched[:] = sched_ns
    t0 = time.monotonic_ns()
    for s in senders:
        if isinstance(s, BinarySender):
            await s.start(rec, t0)
    tasks: set[asyncio.Task[None]] = set()
    for k in range(len(times)):
        delay = (sched_ns[k] - (time.monotonic_ns() - t0)) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        sender = senders[k % len(senders)]
        rec.proto[k] = k % len(senders)
        rec.bucket[k] = texts.bucket(k)
        task = asyncio.create_task(sender.send(rec, k, texts.text(k), t0))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        if k % 4096 == 4095:
            texts.corpus.release()  # pages of texts already sent: keep the client's RSS flat
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline and (tasks or (rec.status == NO_ANSWER).any()):
        await asyncio.sleep(0.05)
    for t in tasks:
        t.cancel()
    return rec, t0


def status_kind(code: int, protos: list[str]) -> str:
    if code == NO_ANSWER:
        return "no answer"
    if code == CONN_ERROR:
        return "connection error"
    if code == CLIENT_FULL:
        return f"client: {MAX_HTTP_CONNS} connections busy"
    if code >= BINARY_BASE:
        return "binary " + wire.STATUS_NAMES.get(code - BINARY_BASE, str(code))
    return f"http {code}"


def is_ok(status: np.ndarray) -> np.ndarray:
    return (status == 200) | (status == BINARY_BASE + wire.OK)


def report(
    rec: Records, protos: list[str], duration: float, warmup_s: float, mem: MemorySampler | None
) -> dict[str, Any]:
    measured = rec.sched >= int(warmup_s * 1e9)
    window = max(1e-9, duration - warmup_s)
    ok = is_ok(rec.status) & measured
    lat_ms = (rec.done - rec.sched) / 1e6  # from the scheduled time: no coordinated omission
    out: dict[str, Any] = {
        "offered_rps": float(measured.sum()) / window,
        "achieved_rps": float(ok.sum()) / window,
        "requests": int(measured.sum()),
        "ok": int(ok.sum()),
        "error_rate": 1.0 - float(ok.sum()) / max(1, int(measured.sum())),
        "errors": dict(
            Counter(status_kind(int(c), protos) for c in rec.status[measured & ~ok]).most_common()
        ),
        "latency_ms": {},
    }
    for p_i, proto in enumerate(protos):
        for b_i, bound in enumerate(TOKEN_BUCKETS):
            sel = ok & (rec.proto == p_i) & (rec.bucket == b_i)
            xs = lat_ms[sel].tolist()
            if xs:
                key = f"{proto} <= {bound} tokens"
                out["latency_ms"][key] = {
                    "n": len(xs),
                    "p50": percentile(xs, 50),
                    "p99": percentile(xs, 99),
                    "p99.9": percentile(xs, 99.9),
                }
        xs = lat_ms[ok & (rec.proto == p_i)].tolist()
        if xs:
            out["latency_ms"][f"{proto} all"] = {
                "n": len(xs),
                "p50": percentile(xs, 50),
                "p99": percentile(xs, 99),
                "p99.9": percentile(xs, 99.9),
            }
    if mem is not None:
        out["memory"] = {
            k: mem.fluctuation(k, warmup_s) for k in ("rss", "pss", "front_rss", "gpu_mem")
        }
        out["memory"] = {k: v for k, v in out["memory"].items() if v}
        out["memory_samples"] = mem.samples  # the series, to look into a swing afterwards
    return out


def print_report(out: dict[str, Any]) -> None:
    print(
        f"offered {out['offered_rps']:.1f} req/s, achieved {out['achieved_rps']:.1f} req/s; "
        f"{out['ok']}/{out['requests']} ok, error rate {out['error_rate'] * 100:.4f}%"
    )
    if out["errors"]:
        print(f"errors by kind: {out['errors']}")
    for key, v in out["latency_ms"].items():
        print(
            f"  {key:<24} n={v['n']:<7} p50={v['p50']:8.1f}ms p99={v['p99']:8.1f}ms "
            f"p99.9={v['p99.9']:8.1f}ms"
        )
    for key, v in out.get("memory", {}).items():
        print(
            f"  memory {key:<10} min {v['min_mib']:.1f} max {v['max_mib']:.1f} "
            f"mean {v['mean_mib']:.1f} MiB; fluctuation {v['fluctuation'] * 100:.2f}% "
            f"({v['samples']} samples after warm-up)"
        )


# -- command line ---------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", required=True, help="a corpus file (ringserve corpus)")
    p.add_argument("--rate", type=float, default=50.0, help="offered requests per second")
    p.add_argument(
        "--rate-share",
        type=float,
        default=0.0,
        help="instead of --rate: this share of the capacity measured first in the same run "
        "(closed loop, HTTP c=32, 10 s)",
    )
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    p.add_argument("--protocol", default="http", help="http, kserve, binary or a comma list")
    p.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson")
    p.add_argument("--closed", type=int, default=0, help="closed loop at this concurrency (HTTP)")
    p.add_argument("--warmup-s", type=float, default=10.0, help="left out of the figures")
    p.add_argument("--drain-s", type=float, default=30.0, help="wait for answers at the end")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--binary-port", type=int, default=8001)
    p.add_argument("--server-pid", type=int, default=0, help="sample this process tree's memory")
    p.add_argument("--launch", default=None, help="start a server with these serve options")
    p.add_argument("--model", default=None, help="artifact for tokenizing (default model)")
    p.add_argument("--json", default=None, help="also write the report here")
    p.add_argument("--idle-s", type=float, default=IDLE_S, help="HTTP connection idle limit")
    args = p.parse_args(argv)
    protos = args.protocol.split(",")
    if any(x not in PROTOCOLS for x in protos):
        p.error(f"--protocol: choose from {', '.join(PROTOCOLS)}")
    args.protos = protos
    return args


def make_senders(args: argparse.Namespace, port: int, binary_port: int) -> list[Any]:
    senders: list[Any] = []
    for proto in args.protos:
        if proto == "binary":
            senders.append(BinarySender(binary_port))
        elif proto == "kserve":
            model = get_json(port, "/v1/model")["name"]
            senders.append(HttpSender(port, model, args.idle_s))
        else:
            senders.append(HttpSender(port, None, args.idle_s))
    return senders


def run(args: argparse.Namespace, port: int, binary_port: int, pid: int) -> dict[str, Any]:
    import uvloop
    from ringserve.factory.build import default_artifact_dir

    model_dir = args.model or str(default_artifact_dir())
    if args.rate_share:  # the capacity on the same texts, drawn across the whole corpus
        texts = Texts(args.corpus, model_dir, limit=1_000_000)
        measured = uvloop.run(capacity(port, texts, 10.0, spread=True))
        args.rate = args.rate_share * measured
        print(f"capacity {measured:.1f} req/s (closed loop, HTTP c=32, 10 s): offering "
              f"{args.rate_share:g} of it, {args.rate:.1f} req/s")  # fmt: skip
    else:
        need = args.closed * 1000 if args.closed else int(args.rate * args.duration * 1.3) + 100
        texts = Texts(args.corpus, model_dir, limit=need)
    print(f"{len(texts)} texts from {args.corpus}; buckets <= {TOKEN_BUCKETS} tokens: "
          f"{np.bincount(texts.buckets, minlength=len(TOKEN_BUCKETS)).tolist()}")  # fmt: skip
    mem = MemorySampler(pid) if pid else None
    if mem is not None:
        mem.start()
    try:
        if args.closed:
            reqs = [http_message("POST", "/v1/classify",
                                 json.dumps({"text": texts.text(k).decode()}).encode())
                    for k in range(len(texts))]  # fmt: skip
            res = uvloop.run(run_load(port, reqs, args.closed, args.duration))
            return {"closed": res.row(), "rps": res.rps}
        times = arrival_times(args.rate, args.duration, args.arrivals == "poisson")
        senders = make_senders(args, port, binary_port)

        async def go() -> tuple[Records, int]:
            try:
                return await open_loop(texts, senders, times, args.drain_s)
            finally:
                for s in senders:
                    s.close()

        rec, _t0 = uvloop.run(go())
    finally:
        if mem is not None:
            mem.stop()
    return report(rec, args.protos, args.duration, args.warmup_s, mem)


@contextlib.contextmanager
def served_texts(texts_tsv: Path, args: list[str], prefix: str) -> Iterator[tuple[Launched, Texts]]:
    """A server started with `args`, its pool whole, and the TSV's texts packed as a corpus."""
    from ringserve.factory.build import default_artifact_dir
    from ringserve.service.offline.corpus import pack

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        corpus = Path(tmp) / "texts.corpus"
        pack(texts_tsv, corpus)
        texts = Texts(str(corpus), str(default_artifact_dir()), limit=100_000)
        srv = Launched(tmp, args)
        try:
            srv.wait_ready()
            wait_pool(srv)
            print(f"server pid {srv.pid}: {' '.join(args)}", flush=True)
            yield srv, texts
        finally:
            print(f"server exited with {srv.terminate()}")


async def capacity(
    port: int, texts: Texts, seconds: float, concurrency: int = 32, spread: bool = False
) -> float:
    """Closed loop of single texts on HTTP: the server's capacity, measured now, on the first
    2,000 texts, or (`spread`) on 2,000 drawn evenly across all of them."""
    step = max(1, len(texts) // 2000) if spread else 1
    reqs = [
        http_message("POST", "/v1/classify", json.dumps({"text": texts.text(k).decode()}).encode())
        for k in range(0, step * 2000, step)
    ]
    return float((await run_load(port, reqs, concurrency, seconds)).rps)


def wait_pool(server: Launched, timeout: float = 300.0) -> None:
    """Until no worker is still starting (serving ones and spares): memory is then steady."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = server.ctl({"cmd": "status"})["workers"]
        if rows and all(w["state"] != "starting" for w in rows):
            return
        time.sleep(0.2)
    raise TimeoutError("worker pool did not finish starting")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    server: Launched | None = None
    port, binary_port, pid = args.port, args.binary_port, args.server_pid
    tmp = tempfile.TemporaryDirectory(prefix="loadgen-")
    try:
        if args.launch is not None:
            server = Launched(tmp.name, args.launch.split())
            server.wait_ready()
            wait_pool(server)
            port, binary_port, pid = server.port, server.binary_port, server.pid
        out = run(args, port, binary_port, pid)
    finally:
        if server is not None:
            code = server.terminate()
            print(f"server exited with {code}")
        tmp.cleanup()
    out["args"] = {k: v for k, v in vars(args).items() if k != "protos"}
    if "closed" in out:
        print(out["closed"])
    else:
        print_report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
