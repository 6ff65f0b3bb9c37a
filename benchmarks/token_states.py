"""What the token-states output (TEI's /embed_all) costs ONNX Runtime, on the default model's
fp32 graph, one pinned thread, batches of 32 short (SST-2) texts padded to their longest:

- `without`: the same graph with output `tokens` removed (an artifact built before it existed);
- `named`: the graph with it, fetching every output but it, as the CPU runner does for every
  batch in which no text asked for token vectors (workers/runtimes/cpu.py OrtRunner.forward);
- `fetched`: the same graph fetching `tokens` too (forward_tokens: a batch with an /embed_all
  text copies out [32, L, 384] floats).

Each cell is the best of --rounds rounds, the variants alternating so that a busy spell hits
them all. Run it under the shared lock: `python -m benchmarks.token_states`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import load_manifest, load_tokenizer
from ringserve.workers.runtimes.onnx_model import TOKENS_OUTPUT, fetched_outputs, open_session

DATA = Path(__file__).resolve().parent.parent / "data" / "sst2" / "sample.tsv"
BATCH = 32


def batches(artifact: Path, texts: int) -> list[dict[str, np.ndarray]]:
    """The first `texts` SST-2 texts, sorted by length, in batches of 32 padded to their longest."""
    manifest = load_manifest(artifact)
    tok = load_tokenizer(artifact, manifest.max_length)
    rows = DATA.read_text(encoding="utf-8").splitlines()[1 : texts + 1]
    ids = sorted((tok.encode(r.split("\t")[0]).ids for r in rows), key=len)
    feeds = []
    for start in range(0, len(ids), BATCH):
        part = ids[start : start + BATCH]
        length = max(len(x) for x in part)
        arr = np.zeros((len(part), length), dtype=np.int64)
        mask = np.zeros_like(arr)
        for r, x in enumerate(part):
            arr[r, : len(x)] = x
            mask[r, : len(x)] = 1
        feeds.append({"input_ids": arr, "attention_mask": mask})
    return feeds


def without_tokens(src: Path, dst: Path) -> None:
    """`src` with the output `tokens` taken out of the graph's outputs (weights shared)."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    keep = [o for o in model.graph.output if o.name != TOKENS_OUTPUT]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    onnx.save_model(model, str(dst))


def timed(session: Any, names: list[str] | None, feeds: list[dict[str, np.ndarray]]) -> float:
    t0 = time.perf_counter()
    for feed in feeds:
        session.run(names, feed)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    artifact = default_artifact_dir()
    manifest = load_manifest(artifact)
    plain = artifact / manifest.onnx_for("fp32", "plain")
    feeds = batches(artifact, args.texts)
    with tempfile.TemporaryDirectory(dir=artifact.parent) as tmp:
        old = Path(tmp) / "without.onnx"
        without_tokens(plain, old)
        # a copy: ONNX Runtime refuses external data reached through a link out of the directory
        shutil.copyfile(artifact / f"{plain.name}.data", Path(tmp) / f"{plain.name}.data")
        new_s, old_s = open_session(plain, 1), open_session(old, 1)
        variants = {
            "without": (old_s, fetched_outputs(old_s)),
            "named": (new_s, fetched_outputs(new_s)),
            "fetched": (new_s, [*fetched_outputs(new_s), TOKENS_OUTPUT]),
        }
        best = dict.fromkeys(variants, float("inf"))
        for session, names in variants.values():  # first calls allocate and pack
            timed(session, names, feeds[:1])
        for _ in range(args.rounds):
            for name, (session, names) in variants.items():
                best[name] = min(best[name], timed(session, names, feeds))
    n = sum(len(f["input_ids"]) for f in feeds)
    print(f"{n} texts in batches of {BATCH}, one thread, best of {args.rounds} rounds")
    for name, seconds in best.items():
        ratio = seconds / best["without"]
        print(f"{name:8} {seconds * 1e3:8.1f} ms  {n / seconds:7.0f} texts/s  {ratio:5.3f}x")


if __name__ == "__main__":
    main()
