"""Raw model throughput against served throughput, side by side in one run on one machine.

raw:    N processes (N = the server's workers, pinned one per core, torch threads as the
        server's) each run the same TorchScript artifact in-process on pre-tokenized batches
        of the server's batch size, padded to the same bucket. Their sum is the ceiling.
served: the real `ringserve serve` on the same texts, one text per HTTP request, closed loop
        at concurrency 1 and 32 (benchmarks/common.py, on uvloop, in this process).
Prints both, P50/P99, and served/raw. Usage: python -m benchmarks.serving [--seconds 15]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import SST2, Launched, LoadResult, classify_request, load_texts, run_load


def _raw_worker(args: tuple[str, list[str], int, int, int, float, int]) -> tuple[int, float]:
    model_dir, texts, cpu, threads, batch, seconds, bucket_cap = args
    os.sched_setaffinity(0, [cpu])
    import numpy as np
    import torch

    from workers.artifact import load_manifest, load_model, load_tokenizer
    from workers.batcher import bucket_index

    torch.set_num_threads(threads)
    manifest = load_manifest(model_dir)
    tok = load_tokenizer(model_dir, manifest.max_length)
    model = load_model(model_dir)
    encs = [e.ids for e in tok.encode_batch(texts)]
    buckets = (64, 128, 256)
    width = buckets[bucket_index(buckets, max(len(e) for e in encs[:batch]))]
    width = min(width, bucket_cap)
    ids = np.zeros((batch, width), dtype=np.int64)
    mask = np.zeros_like(ids)
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    done, i = 0, 0
    with torch.inference_mode():
        for _ in range(3):  # warm-up, as the workers do
            model(ids_t, mask_t)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            ids[:] = 0
            mask[:] = 0
            for row in range(batch):
                e = encs[i % len(encs)][:width]
                i += 1
                ids[row, : len(e)] = e
                mask[row, : len(e)] = 1
            model(ids_t, mask_t)
            done += batch
        elapsed = time.perf_counter() - t0
    return done, elapsed


def raw_throughput(
    model_dir: str, texts: list[str], workers: int, threads: int, batch: int, seconds: float
) -> float:
    ctx = multiprocessing.get_context("spawn")
    cpus = sorted(os.sched_getaffinity(0))
    # Only texts that fit the first bucket, as the served run's SST-2 sentences do.
    jobs = [
        (model_dir, texts, cpus[k % len(cpus)], threads, batch, seconds, 64) for k in range(workers)
    ]
    with ctx.Pool(workers) as pool:
        results = pool.map(_raw_worker, jobs)
    return sum(done / elapsed for done, elapsed in results)


def served(port: int, texts: list[str], levels: list[int], seconds: float) -> list[LoadResult]:
    import uvloop

    requests = [classify_request(t) for t in texts]

    async def go() -> list[LoadResult]:
        return [await run_load(port, requests, c, seconds) for c in levels]

    return uvloop.run(go())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--data", default=str(SST2), help="TSV, texts in column 1 (default: sample)")
    p.add_argument("--server-args", default="", help="extra `ringserve serve` options")
    args = p.parse_args(argv)
    from workers.artifact import default_artifact_dir

    model_dir = str(default_artifact_dir())
    texts = load_texts(args.data, 4000)
    print(
        f"machine: {os.cpu_count()} cpus; workers={args.workers} x threads={args.threads}; "
        f"max batch {args.max_batch}; {len(texts)} SST-2 sentences"
    )
    raw = 0.0
    # The server's batch size, and half of it (what each of 2 workers sees at concurrency 32).
    for batch in sorted({args.max_batch, max(1, args.max_batch // 2)}, reverse=True):
        r = raw_throughput(model_dir, texts, args.workers, args.threads, batch, args.seconds)
        print(f"raw in-process model: {r:8.1f} texts/s ({args.workers} processes, batch {batch})")
        raw = r if batch == args.max_batch else raw
    extra = [
        "--workers",
        str(args.workers),
        "--threads",
        str(args.threads),
        "--max-batch",
        str(args.max_batch),
        *args.server_args.split(),
    ]
    with tempfile.TemporaryDirectory(prefix="ringserve-serving-") as tmp:
        srv = Launched(tmp, extra, binary=False)
        try:
            srv.wait_ready()
            results = served(srv.port, texts, [1, 32], args.seconds)
        finally:
            srv.terminate()
    print("served /v1/classify (one text a request):")
    for r in results:
        print("  " + r.row())
    ratio = results[-1].rps / raw if raw else 0.0
    print(f"served/raw at concurrency 32: {ratio:.3f} (target >= 0.85)")
    return 0


def summary_dict(raw: float, results: list[LoadResult]) -> dict[str, Any]:
    return {"raw": raw, **{f"c{r.concurrency}": r.rps for r in results}}


if __name__ == "__main__":
    sys.exit(main())
