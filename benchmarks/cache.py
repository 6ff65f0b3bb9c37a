"""The answer cache (--cache-bytes) at a 50% repeat rate: served texts per second of one server
with the cache and one without (--cache-bytes 0), on the same requests, in one run.

  python -m benchmarks.cache [--seconds 5] [--rounds 2] [--c 32] [--repeats numbered|bare]

The default model, default workers, no spare. The request stream is one text a
`/v1/embeddings` request, alternately a text never sent before (a data/ text with its own
number before it, so no two are alike) and one of a hot set of HOT texts sent once to each
server before its timed draw, so half of the texts were seen before. A hot text carries a
number too (`numbered`, the default), from the range the fresh texts' numbers cover in a draw,
so a repeat is as long in tokens as a fresh text: `bare` repeats (as before 2026-12-07 13:50)
were a fifth shorter than the fresh texts on the short mix (12.9 tokens against 16.2), so the
uncached server's average text was cheaper than the cached server's misses and the ratio was
held near 1.8 whatever a hit cost. Each server's mean tokens a text of either half, as its own
usage counts them, are printed. Each request is sent at most once (closed loop of c clients
over a stream longer than any draw). The two servers run one after the other, in turns
(`--rounds` of each, the order swapped each round, so a drift in the machine's load cancels),
on the same cores; the ratio is of their medians. Each server's memory (front-end RSS) and its
cache figures from /metrics are shown, and the CPU a served text cost (the server's processes
and this load generator): `cpu_ratio`, the uncached server's over the cached one's, is what the
ratio would be with the two cores all theirs, and moves far less than texts/s with the load
other work puts on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from devkit.http import http_message, http_request
from devkit.launcher import AG_NEWS, SST2, Launched, load_texts
from devkit.load import run_load

HOT = 500  # texts a repeat is drawn from
STREAM = 100_000  # requests in the stream (each sent at most once: 32 clients x 2,025 apart)


def body(text: str) -> bytes:
    data = json.dumps({"input": text}).encode()
    return http_message("POST", "/v1/embeddings", data, {"Content-Type": "application/json"})


def stream(texts: list[str], numbered: bool = True) -> tuple[list[str], list[bytes]]:
    """(the hot set, the stream: new and hot texts in turn). A hot text's number (`numbered`)
    is from 0 to 4 * HOT, as the first 2,000 fresh texts' are."""
    hot = [f"{4 * j}: {t}" if numbered else t for j, t in enumerate(texts[:HOT])]
    rest = texts[HOT:]
    fresh = [f"{i}: {rest[i % len(rest)]}" for i in range(STREAM // 2)]  # never sent before
    assert not set(hot) & set(fresh), "a repeat that is also a fresh text"
    out = []
    for i in range(STREAM // 2):
        out.append(body(fresh[i]))
        out.append(body(hot[(i * 7) % HOT]))  # seen before
    return hot, out


def send_once(port: int, texts: list[str]) -> int:
    """Each text once, as /v1/embeddings requests of 100 (the hot set, before a draw); the
    tokens the server counted in them."""
    tokens = 0
    for i in range(0, len(texts), 100):
        doc = json.dumps({"input": texts[i : i + 100]})
        status, _, data = http_request(port, "POST", "/v1/embeddings", doc, timeout=120)
        assert status == 200, data[:200]
        tokens += json.loads(data)["usage"]["prompt_tokens"]
    return tokens


def fresh_tokens(port: int, reqs: list[bytes], n: int = 500) -> float:
    """Mean tokens of the stream's first `n` fresh texts (sent again, after the draw)."""
    texts = [json.loads(r.split(b"\r\n\r\n", 1)[1])["input"] for r in reqs[0 : 2 * n : 2]]
    return send_once(port, texts) / n


def tree_cpu(pid: int) -> float:
    """CPU seconds of the server's processes (front-end and workers) so far."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def scrape(port: int) -> dict[str, float]:
    _, _, data = http_request(port, "GET", "/metrics")
    found = re.findall(r"^(ringserve_cache_\w+) (\S+)$", data.decode(), re.M)
    return {k.removeprefix("ringserve_cache_"): float(v) for k, v in found}


def draw(work: Path, cache_bytes: int, hot: list[str], reqs: list[bytes], args: Any) -> dict:
    srv = Launched(work, ["--spares", "0", "--cache-bytes", str(cache_bytes)])
    try:
        srv.wait_ready(None, 300)
        hot_tokens = send_once(srv.port, hot) / len(hot)
        cpu = tree_cpu(srv.pid) + time.process_time()
        r = asyncio.run(run_load(srv.port, reqs, args.c, args.seconds, warmup_s=0))
        cpu = tree_cpu(srv.pid) + time.process_time() - cpu
        assert not r.failed, r.codes
        cache = scrape(srv.port)
        rss = psutil.Process(srv.pid).memory_info().rss
        tokens = {"repeated": round(hot_tokens, 2), "fresh": round(fresh_tokens(srv.port, reqs), 2)}
    finally:
        srv.terminate(60)
    return {"cache_bytes": cache_bytes, "texts_per_s": round(r.rps, 1),
            "p50_ms": round(r.pct(50), 1), "p99_ms": round(r.pct(99), 1),
            "front_end_rss_mib": round(rss / 2**20, 1), "cache": cache,
            "tokens_a_text": tokens, "cpu_ms_a_text": round(1e3 * cpu / r.ok, 3)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--c", type=int, default=32)
    p.add_argument("--cache-bytes", type=int, default=64 << 20)
    p.add_argument("--mix", choices=("long", "short", "both"), default="both")
    p.add_argument("--repeats", choices=("numbered", "bare"), default="numbered")
    args = p.parse_args(argv)
    from benchmarks.serving import cpu_name, simd_flags

    print(f"machine: {cpu_name()}, {os.cpu_count()} cpus, flags {simd_flags()}", flush=True)
    both = (("long", AG_NEWS), ("short", SST2))
    mixes = [(m, path) for m, path in both if args.mix in (m, "both")]
    summary = {}
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        for mix, path in mixes:
            hot, reqs = stream(load_texts(path), args.repeats == "numbered")
            runs: dict[str, list[float]] = {"off": [], "on": [], "cpu_off": [], "cpu_on": []}
            for r in range(args.rounds):
                turns = [("off", 0), ("on", args.cache_bytes)]
                for name, size in turns if r % 2 == 0 else turns[::-1]:  # drift cancels
                    row = draw(Path(tmp), size, hot, reqs, args)
                    print(json.dumps({"mix": mix, "c": args.c, **row}), flush=True)
                    runs[name].append(row["texts_per_s"])
                    runs[f"cpu_{name}"].append(row["cpu_ms_a_text"])
            off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
            cpu = statistics.median(runs["cpu_off"]) / statistics.median(runs["cpu_on"])
            summary[mix] = {"uncached": off, "cached": on, "ratio": round(on / off, 3),
                            "cpu_ratio": round(cpu, 3)}  # fmt: skip
    print(json.dumps({"repeat_rate": 0.5, "c": args.c, "repeats": args.repeats,
                      "texts_per_s": summary}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
