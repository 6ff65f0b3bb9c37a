"""Can a lone request use both cores? The default model's ONNX graphs at batch 1, one text at a
time, in one process: one intra-op thread pinned to one core against two intra-op threads on
both cores, with ONNX Runtime's spinning on and off and the helper thread pinned or not.

Texts: the first --texts of data/sst2 (short) and of data/ag_news (long), each run alone (batch
1, no padding), in turns: every text goes through every setting before the next text, so a busy
spell on the host hits all settings alike, --repeat turns a text, its best time kept (a shared
host's other work lands on the two-thread settings first). Printed: P50 and P90 ms a text, and
the speedup of each setting's P50 over one thread's on the same texts and graph. The issue's
target for a lone request (c=1 P50 <= 0.65 of one thread's batch-1 time) needs at least
1/0.65 = 1.54x here, and more for the serving path around the model.

`python -m benchmarks.lone_threads [--texts 200] [--graphs plain,fused]`; run it alone (under
the project's heavy lock: anything else on the cores spoils two-thread timings first).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import load_manifest, load_tokenizer

DATA = Path(__file__).resolve().parent.parent / "data"
TEXTS = {"short": DATA / "sst2" / "sample.tsv", "long": DATA / "ag_news" / "sample.tsv"}

# name -> (intra-op threads, allow spinning, pin the helper thread to the other core, ORT's
# session.dynamic_block_base: 0 leaves it unset)
SETTINGS: dict[str, tuple[int, bool, bool, int]] = {
    "1 thread": (1, True, False, 0),
    "2 threads, spin": (2, True, False, 0),
    "2 threads, spin, helper pinned": (2, True, True, 0),
    "2 threads, spin, helper pinned, dynamic blocks 4": (2, True, True, 4),
    "2 threads, no spin": (2, False, False, 0),
    "2 threads, no spin, helper pinned": (2, False, True, 0),
}


def session(path: Path, setting: tuple[int, bool, bool, int], other_cpu: int) -> Any:
    import onnxruntime as ort

    threads, spin, pinned, blocks = setting
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if pinned and threads > 1:  # ORT numbers processors from 1; one entry a helper thread
        options.add_session_config_entry("session.intra_op_thread_affinities", str(other_cpu + 1))
    if blocks:
        options.add_session_config_entry("session.dynamic_block_base", str(blocks))
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds(tokenizer: Any, path: Path, count: int) -> list[dict[str, np.ndarray]]:
    rows = path.read_text(encoding="utf-8").splitlines()[1 : count + 1]
    out = []
    for e in tokenizer.encode_batch([r.split("\t")[0] for r in rows]):
        ids = np.array([e.ids], dtype=np.int64)
        out.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    return out


def timed(sess: Any, feed: dict[str, np.ndarray]) -> float:
    t0 = time.perf_counter()
    sess.run(None, feed)
    return (time.perf_counter() - t0) * 1000


def measure(
    path: Path, texts: list[dict[str, np.ndarray]], cpus: list[int], repeat: int
) -> dict[str, Any]:
    """Every setting's ms a text. The calling thread is pinned to one core, as a serving lane
    is; a helper thread not pinned by ORT keeps both cores (it is made while the caller has
    both), a pinned one is on the other core. A text's time is its best of `repeat` turns (a
    turn runs every setting once): what other work on the host adds is left out as far as one
    turn in `repeat` misses it."""
    one, other = cpus[-1], cpus[0]
    os.sched_setaffinity(0, set(cpus))
    sessions = {name: session(path, setting, other) for name, setting in SETTINGS.items()}
    os.sched_setaffinity(0, {one})
    ms: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for feed in texts[:5]:  # warm every session
        for sess in sessions.values():
            timed(sess, feed)
    for feed in texts:
        best = {name: float("inf") for name in SETTINGS}
        for _ in range(repeat):
            for name, sess in sessions.items():
                best[name] = min(best[name], timed(sess, feed))
        for name in SETTINGS:
            ms[name].append(best[name])
    return {name: np.array(v) for name, v in ms.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=200, help="texts of each length")
    p.add_argument("--graphs", default="plain,fused", help="the artifact's graphs to time")
    p.add_argument("--repeat", type=int, default=3, help="turns a text; its best is kept")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("needs two CPUs", file=sys.stderr)
        return 2
    model_dir = default_artifact_dir()
    m = load_manifest(model_dir)
    tokenizer = load_tokenizer(model_dir, m.max_length)
    files = {"plain": m.onnx_file, "fused": m.fused_file}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"model: {model_dir.name}; cpus {cpus}; best of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.2f}; {when}")  # fmt: skip
    for kind, path in TEXTS.items():
        texts = feeds(tokenizer, path, args.texts)
        lengths = [f["input_ids"].shape[1] for f in texts]
        print(f"\n{kind}: {len(texts)} texts, tokens mean {np.mean(lengths):.1f}, "
              f"median {np.median(lengths):.0f}, max {max(lengths)}")  # fmt: skip
        for graph in args.graphs.split(","):
            if not files.get(graph):
                continue
            ms = measure(model_dir / files[graph], texts, cpus, args.repeat)
            base = float(np.median(ms["1 thread"]))
            print(f"| {kind} | {graph} | setting | P50 ms | P90 ms | speedup of P50 |")
            print("| --- | --- | --- | --- | --- | --- |")
            for name, v in ms.items():
                p50, p90 = float(np.median(v)), float(np.percentile(v, 90))
                print(f"| {kind} | {graph} | {name} | {p50:.2f} | {p90:.2f} | "
                      f"{base / p50:.2f}x |", flush=True)  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
