"""How fast bf16 can be on this CPU: the ceiling a server's bf16 is held to.

Two measurements, one thread each, nothing else running:

1. A MatMul alone under OpenVINO, f32 against bf16, at the default model's own shapes (the
   tokens of a batch of 32 short or long texts, times the hidden size into the feed-forward
   width and back): GFLOP/s each and the ratio, the most bf16 buys this CPU's matrix products.
2. The served default model on a batch of 32 real texts of the mix's median length (short
   SST-2, long AG News), the most texts a batch holds at c=32: ONNX Runtime fp32 (what
   `--precision fp32` serves) against OpenVINO bf16 (what `auto` serves where it picks bf16),
   and OpenVINO f32 with its per-layer counters on, for how a batch splits between the matrix
   products (FullyConnected, MatMul) and the rest (softmax, layer norms, GELU, gathers,
   reorders) at each precision. Amdahl's law on that split, with the products at part 1's best
   ratio and the rest as fast as bf16 ran it, bounds what bf16 can gain over OpenVINO f32.

3. Two threads (the default worker's two cores), OpenVINO bf16, in a fresh process each: one
   request on both threads (what a worker runs: workers/runtimes/openvino.py) against two
   streams with a request each, driven from two threads: texts/s on each batch of part 2 for 4
   s, and the process's anonymous memory after (the second stream's own copy of what it needs).

Issue 60 asks `--precision auto` for >= 2x fp32 at c=32 on a CPU with AMX or AVX512_BF16. A
server's batch at c=32 is at most these 32 texts, so its bf16-over-fp32 cannot pass part 2's
ratio on this CPU.

`python -m benchmarks.bf16_ceiling [--repeat 30]`; run it alone (under the project's heavy
lock). It needs a CPU with avx512_bf16 or amx_bf16, and says so otherwise.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import load_manifest, load_tokenizer
from ringserve.workers.runtimes.onnx_model import open_session
from ringserve.workers.runtimes.openvino import compile_model

from benchmarks.serving import cpu_name, simd_flags
from devkit.launcher import AG_NEWS, SST2, load_texts

BATCH = 32  # the most texts a batch can hold at c=32
PRODUCTS = {"FullyConnected", "MatMul"}  # the CPU plugin's names for a matrix product


def best_s(request: Any, feed: dict[Any, np.ndarray], repeat: int) -> float:
    """The fastest of `repeat` timed inferences, after five warm ones."""
    for _ in range(5):
        request.infer(feed)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        request.infer(feed)
        times.append(time.perf_counter() - t0)
    return min(times)


class SessionCall:
    """An ONNX Runtime session behind best_s's `infer(feed)`."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def infer(self, feed: dict[Any, np.ndarray]) -> Any:
        return self.session.run(None, feed)


def matmul_gflops(m: int, k: int, n: int, repeat: int) -> dict[str, float]:
    import openvino as ov
    from openvino import opset13 as ops

    rng = np.random.default_rng(0)
    x = ops.parameter([m, k], np.float32)
    w = ops.constant((rng.standard_normal((k, n)) * 0.02).astype(np.float32))
    model = ov.Model([ops.matmul(x, w, False, False)], [x])
    a = rng.standard_normal((m, k)).astype(np.float32)
    out = {}
    for hint in ("f32", "bf16"):
        config = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": 1,
                  "NUM_STREAMS": 1, "ENABLE_CPU_PINNING": False}  # fmt: skip
        request = ov.Core().compile_model(model, "CPU", config).create_infer_request()
        out[hint] = 2 * m * k * n / best_s(request, {0: a}, repeat) / 1e9
    return out


def model_split(
    path: Any, precision: str, feed: dict[str, np.ndarray], repeat: int
) -> dict[str, float]:
    """A batch's best wall time, and the mean per-layer time of the products and of the rest
    (OpenVINO's counters, summed over the layers that ran), in ms."""
    wall = best_s(compile_model(path, precision, 1).create_infer_request(), feed, repeat)
    counted = compile_model(path, precision, 1, PERF_COUNT=True).create_infer_request()
    sums: dict[str, float] = defaultdict(float)
    for _ in range(repeat):
        counted.infer(feed)
        for layer in counted.profiling_info:
            if layer.status.name != "EXECUTED":
                continue
            part = "products" if layer.node_type in PRODUCTS else "rest"
            sums[part] += layer.real_time.total_seconds() * 1e3 / repeat
    return {"wall": wall * 1e3, "products": sums["products"], "rest": sums["rest"]}


def two_threads(
    path: str, streams: int, feeds: list[dict[str, np.ndarray]], cpus: set[int]
) -> list[float]:
    """Part 3 in this (fresh) process on `cpus`: texts/s of each feed on `streams` requests of
    one compiled model (two threads in all), then the process's anonymous memory in MiB."""
    import threading

    os.sched_setaffinity(0, cpus)
    if streams == 1:  # a worker's own compile
        compiled = compile_model(path, "bf16", 2)
    else:
        compiled = compile_model(
            path, "bf16", 2, NUM_STREAMS=streams, PERFORMANCE_HINT="THROUGHPUT"
        )
    requests = [compiled.create_infer_request() for _ in range(streams)]
    out = []
    for feed in feeds:
        done = [0] * streams

        def drive(i: int, until: float, feed: dict[str, np.ndarray], done: list[int]) -> None:
            while time.perf_counter() < until:
                requests[i].infer(feed)
                done[i] += 1

        for r in requests:  # warm: each shape's kernels
            r.infer(feed)
        t0 = time.perf_counter()
        lanes = [
            threading.Thread(target=drive, args=(i, t0 + 4.0, feed, done)) for i in range(streams)
        ]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()
        out.append(sum(done) * len(feed["input_ids"]) / (time.perf_counter() - t0))
    rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
    anon = next(int(line.split()[1]) for line in rollup if line.startswith("Anonymous:"))
    return [*out, anon / 1024]


def feed_of(tokenizer: Any, texts: list[str]) -> dict[str, np.ndarray]:
    """A batch as a worker makes one: BATCH texts of about the mix's median length (the
    middle of its first 400 texts by tokens), padded to the longest of them."""
    encs = sorted(tokenizer.encode_batch(texts), key=lambda e: len(e.ids))
    middle = (len(encs) - BATCH) // 2
    encs = encs[middle : middle + BATCH]
    length = max(len(e.ids) for e in encs)
    ids = np.zeros((len(encs), length), dtype=np.int64)
    mask = np.zeros((len(encs), length), dtype=np.int64)
    for i, e in enumerate(encs):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=30, help="timed inferences of each case")
    args = p.parse_args(argv)
    flags = simd_flags()
    have = Path("/proc/cpuinfo").read_text().split()
    if "avx512_bf16" not in have and "amx_bf16" not in have:
        print(f"this CPU has neither avx512_bf16 nor amx_bf16 ({flags}): nothing to measure")
        return 0
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(cpus)})
    model_dir = default_artifact_dir()
    m = load_manifest(model_dir)
    tokenizer = load_tokenizer(model_dir, m.max_length)
    path = model_dir / m.onnx_file
    print(f"machine: {cpu_name()}, {os.cpu_count()} cpus, flags {flags}")
    print(f"model: {model_dir.name}; one thread; batches of {BATCH} texts; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")  # fmt: skip
    feeds = {kind: feed_of(tokenizer, load_texts(src, 400)) for kind, src in
             (("short", SST2), ("long", AG_NEWS))}  # fmt: skip
    hidden = m.dimension  # the encoder's width (the default model embeds at it)
    print("\n| MatMul (m x k x n) | f32 GFLOP/s | bf16 GFLOP/s | bf16 / f32 |")
    print("| --- | --- | --- | --- |")
    ratios = []
    for kind, feed in feeds.items():
        tokens = int(feed["input_ids"].size)
        for k, n in ((hidden, 4 * hidden), (4 * hidden, hidden)):
            g = matmul_gflops(tokens, k, n, args.repeat)
            ratios.append(g["bf16"] / g["f32"])
            print(f"| {tokens} x {k} x {n} ({kind}) | {g['f32']:.0f} | {g['bf16']:.0f} | "
                  f"{g['bf16'] / g['f32']:.2f} |")  # fmt: skip
    gemm = max(ratios)
    print(f"\n| mix | batch | ORT fp32 ms | OpenVINO f32 ms | OpenVINO bf16 ms | bf16 over ORT "
          f"fp32 | bf16 over OV f32 | OV f32 products / rest ms | bf16 products / rest ms | "
          f"bound over OV f32 (products at {gemm:.2f}x) |")  # fmt: skip
    print("| --- " * 10 + "|")
    for kind, feed in feeds.items():
        session = open_session(path)
        ort = best_s(SessionCall(session), feed, args.repeat) * 1e3
        f = model_split(path, "fp32", feed, args.repeat)
        b = model_split(path, "bf16", feed, args.repeat)
        bound = (f["products"] + f["rest"]) / (f["products"] / gemm + b["rest"])
        rows, length = feed["input_ids"].shape
        print(f"| {kind} | {rows} x {length} | {ort:.2f} | {f['wall']:.2f} | {b['wall']:.2f} | "
              f"{ort / b['wall']:.2f} | {f['wall'] / b['wall']:.2f} | "
              f"{f['products']:.2f} / {f['rest']:.2f} | {b['products']:.2f} / {b['rest']:.2f} | "
              f"{bound:.2f} |")  # fmt: skip
    print("\n| two threads, OpenVINO bf16 | short texts/s | long texts/s | anonymous MiB |")
    print("| --- | --- | --- | --- |")
    spawn = multiprocessing.get_context("spawn")
    cases = ((1, "one request on both (a worker's)"), (2, "two streams, a request each"))
    for streams, name in cases:
        with spawn.Pool(1) as pool:
            case = (str(path), streams, list(feeds.values()), cpus)
            short, long, anon = pool.apply(two_threads, case)
        print(f"| {name} | {short:.0f} | {long:.0f} | {anon:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
