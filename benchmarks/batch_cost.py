"""What a CPU batch costs, per runtime: the fixed cost of a batch in tokens of work.

A batch of n texts padded to L tokens takes about a + b * n * L seconds on one pinned thread:
`a` is the per-call cost (the runtime's set-up, the classifier, Python), `b` the cost of one
token. The batcher weighs padding against that fixed cost, so it needs a / b, in tokens: the
figures in workers/batches.py (BATCH_OVERHEAD) come from this script. It times every shape of a
grid inside the range batches are formed in (n * L up to the default token budget), fits a and b
by least squares, and prints them with the worst relative error of the fit.

  python -m benchmarks.batch_cost [--runtimes torch:fp32,onnx:fp32,onnx:int8] [--cpu 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
from ringserve.service.config.settings import CPU_MAX_BATCH_TOKENS

from devkit.models import raw_runner

LENGTHS = (8, 12, 16, 24, 32, 48, 64)
ROWS = (1, 2, 4, 8, 16, 32)


def time_shape(runner: Any, rows: int, length: int, seconds: float) -> float:
    """Median seconds of one forward pass over `rows` texts of `length` tokens."""
    from ringserve.workers.batches import Item

    ids = [101, *(2000 + k % 50 for k in range(length - 2)), 102]
    runner.fill(length, [Item(0, 0, 0, ids) for _ in range(rows)])
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while len(times) < 5 or time.perf_counter() < stop:
        t0 = time.perf_counter()
        runner.forward(length, rows)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit(samples: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(a, b, worst relative error) of t = a + b * n * L over (n, L, t) samples."""
    tokens = np.array([n * length for n, length, _ in samples], dtype=np.float64)
    t = np.array([s for _, _, s in samples])
    a, b = np.linalg.lstsq(np.stack([np.ones_like(tokens), tokens], 1), t, rcond=None)[0]
    worst = float(np.max(np.abs(a + b * tokens - t) / t))
    return float(a), float(b), worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtimes", default="torch:fp32,onnx:fp32,onnx:int8")
    p.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    p.add_argument("--seconds", type=float, default=0.3, help="per shape")
    args = p.parse_args(argv)
    os.sched_setaffinity(0, [args.cpu])
    from ringserve.factory.build import default_artifact_dir

    model_dir = str(default_artifact_dir())
    print(f"one thread pinned to cpu {args.cpu}; shapes with rows x length <= "
          f"{CPU_MAX_BATCH_TOKENS}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| runtime | a (ms a batch) | b (us a token) | a / b (tokens) | worst fit error |")
    print("| --- | --- | --- | --- | --- |")
    for spec in args.runtimes.split(","):
        runtime, precision = spec.split(":")
        runner = raw_runner(model_dir, runtime, precision, max(ROWS))
        runner.warm()
        samples = [
            (n, length, time_shape(runner, n, length, args.seconds))
            for length in LENGTHS
            for n in ROWS
            if n * length <= CPU_MAX_BATCH_TOKENS
        ]
        a, b, worst = fit(samples)
        print(f"| {runtime} {precision} | {a * 1e3:.2f} | {b * 1e6:.1f} | {a / b:.1f} | "
              f"{worst:.0%} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
