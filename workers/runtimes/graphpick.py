"""Which fp32 graph is faster on this CPU, the plain export or ONNX Runtime's fused one: both
timed at the shapes the CPU batcher makes, in a second or two, by a child process at start (the
front-end never loads ONNX Runtime itself). The answer is kept per artifact and CPU.

Why measure: on an AVX2 machine without VNNI the fused graph lost 7-10% of throughput (issue
27's table), on this AVX-512 VNNI one 8% (the artifact build's own timing: 302 against 327
texts/s), while on others it is what wins; machines of one kind differ by 2-3x.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.workers.artifact import load_manifest, load_tokenizer
from ringserve.workers.cpu import speed_key
from ringserve.workers.runtimes.onnx_model import fetched_outputs, open_session

GRAPHS = ("plain", "fused")
CHOICES = ("auto", *GRAPHS)
# (rows, tokens) a CPU batch takes under the default 512-token budget: a lone short text, a
# batch of short texts at c=32, a batch of long ones.
SHAPES = ((1, 16), (8, 32), (2, 128))
BUDGET_S = 1.0  # timing rounds stop after this long (at least MIN_ROUNDS of them)
MIN_ROUNDS = 3
TIMEOUT_S = 60.0  # the child: loading two 90 MB graphs and the timing itself take seconds


def time_graphs(model_dir: str, files: dict[str, str], vocab: int) -> dict[str, Any]:
    """Median seconds of one round (every shape once) for each graph, rounds alternating."""
    sessions = {g: open_session(Path(model_dir) / f) for g, f in files.items()}
    token = min(1000, vocab - 1)  # any id in range: the cost does not depend on the text
    feeds = [
        {"input_ids": np.full(s, token, np.int64), "attention_mask": np.ones(s, np.int64)}
        for s in SHAPES
    ]
    for session in sessions.values():  # first calls allocate and pack; not what is timed
        for feed in feeds:
            session.run(fetched_outputs(session), feed)
    rounds: dict[str, list[float]] = {g: [] for g in sessions}
    start = time.perf_counter()
    while len(rounds["plain"]) < MIN_ROUNDS or time.perf_counter() - start < BUDGET_S:
        for graph, session in sessions.items():
            t0 = time.perf_counter()
            for feed in feeds:
                session.run(fetched_outputs(session), feed)
            rounds[graph].append(time.perf_counter() - t0)
    return {g: statistics.median(r) for g, r in rounds.items()}


def choose(model_dir: str, manifest: Any, wanted: str, cache_dir: Path | None) -> dict[str, Any]:
    """The graph to serve at fp32 and why: {"graph", "chosen_by", "ms"?, ...}."""
    if not manifest.fused_file:
        why = manifest.graphs.get("fused", {}).get("why", "built before fused graphs")
        return {"graph": "plain", "chosen_by": f"the artifact has no fused graph ({why})"}
    if wanted != "auto":
        return {"graph": wanted, "chosen_by": "--graph"}
    cached = _cache_file(cache_dir, manifest.fingerprint)
    if cached is not None and cached.is_file():
        with contextlib.suppress(OSError, ValueError):
            found = json.loads(cached.read_text())
            return found | {"chosen_by": "timing at start (kept for this artifact and CPU)"}
    found = _run_child(model_dir)
    if cached is not None and "ms" in found:
        with contextlib.suppress(OSError, ValueError):
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(found))
    return found | {"chosen_by": "timing at start"}


def _cache_file(cache_dir: Path | None, fingerprint: str) -> Path | None:
    if cache_dir is None:
        return None
    name = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    return cache_dir / "graphs" / f"{name}-{speed_key()}.json"


def _run_child(model_dir: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ringserve.workers.runtimes.graphpick", model_dir]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        return {"graph": "plain", "error": f"timing failed: {exc}"}


def main(model_dir: str) -> int:
    manifest = load_manifest(model_dir)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[-1:])  # one core, as a worker runs
    vocab = load_tokenizer(model_dir, manifest.max_length).get_vocab_size(with_added_tokens=True)
    files = {g: manifest.onnx_for("fp32", g) for g in GRAPHS}
    t0 = time.perf_counter()
    seconds = time_graphs(model_dir, files, vocab)
    best = min(seconds, key=seconds.__getitem__)
    print(
        json.dumps(
            {
                "graph": best,
                "ms": {g: round(s * 1000, 2) for g, s in seconds.items()},
                "shapes": [list(s) for s in SHAPES],
                "timing_s": round(time.perf_counter() - t0, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
