"""The runtimes this CPU can run the default model on, side by side: one pinned thread's texts/s
at batch 1, 8 and 32 on short (SST-2) and long (AG News) texts, and each one's agreement with
ONNX Runtime fp32 and accuracy on the publication split (factory/default_head/publication.tsv),
each with its 95% interval. The CPU's model name and its flags come first.

Rows: ONNX Runtime fp32 (plain and fused graphs), its dynamic int8 (the artifact's recipe), its
static QDQ int8 (activations u8, weights s8 per channel; calibrated on factory/int8.py's
calibration rows), OpenVINO fp32 and OpenVINO int8 (NNCF post-training quantization, the same
calibration rows); bf16 only where the CPU has AVX512_BF16 or AMX (OpenVINO's precision hint).

Each timing cell is the best of --rounds rounds (which alternate the runtimes, so a busy spell
hits them all) over a fixed number of texts (--texts at batch 32; a quarter of it at batch 1,
half at batch 8): the sample file's first ones, sorted by length as the server's batcher groups
them, each batch padded to its longest.
OpenVINO and NNCF come with the `bench` extra: `pip install -e '.[bench]'`, then
`python -m benchmarks.runtimes`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.factory import int8
from ringserve.factory import onnx as ox
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import load_manifest, load_tokenizer
from ringserve.workers.runtimes.onnx_model import open_session

DATA = Path(__file__).resolve().parent.parent / "data"
TEXTS = {"short": DATA / "sst2" / "sample.tsv", "long": DATA / "ag_news" / "sample.tsv"}
BATCHES = (1, 8, 32)
SHARE = {1: 1, 8: 2, 32: 4}  # quarters of --texts a cell runs at each batch size
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")

Run = Callable[[dict[str, np.ndarray]], np.ndarray]


def cpu() -> tuple[str, set[str]]:
    """The CPU's model name and flags, from /proc/cpuinfo."""
    name, flags = "unknown", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            name = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    return name, flags


class Session:
    """Any runtime behind the one call ox.session_logits makes."""

    def __init__(self, run: Run) -> None:
        self.forward = run

    def run(self, _: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [self.forward(feeds)]


def ort_run(path: Path) -> Run:
    session = open_session(path, 1)
    return lambda feeds: np.asarray(session.run(None, feeds)[0])


def ov_run(model: Any, hint: str = "f32") -> Run:
    import openvino as ov

    config = {
        "INFERENCE_NUM_THREADS": 1,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": hint,
    }
    compiled = ov.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    out = compiled.outputs[0]
    return lambda feeds: np.asarray(request.infer(feeds)[out])


def calibration_feeds(model_dir: Path, max_length: int) -> list[dict[str, np.ndarray]]:
    tokenizer = load_tokenizer(model_dir, max_length)
    return list(int8._feeds(tokenizer.encode_batch(int8._rows(int8.CALIBRATION))))


def nncf_int8(src: Path, feeds: list[dict[str, np.ndarray]]) -> Any:
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(src))
    with contextlib.redirect_stdout(sys.stderr):  # its progress bars stay out of the table
        return nncf.quantize(
            model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(feeds),
        )  # fmt: skip


def runtimes(model_dir: Path, work: Path, flags: set[str]) -> Iterator[tuple[str, Run | str]]:
    """(name, forward) of each runtime, or (name, why it is not measured)."""
    m = load_manifest(model_dir)
    plain = model_dir / m.onnx_file
    yield "ORT fp32 plain", ort_run(plain)
    yield "ORT fp32 fused", ort_run(model_dir / m.onnx_for("fp32", "fused"))
    yield f"ORT int8 dynamic ({m.int8.get('recipe', 'dynamic')})", ort_run(model_dir / m.int8_file)
    feeds = calibration_feeds(model_dir, m.max_length)
    int8.quantize_qdq(plain, work / "qdq.onnx", feeds, unsigned=True)  # u8s8
    yield "ORT int8 static QDQ u8s8", ort_run(work / "qdq.onnx")
    try:
        import openvino  # noqa: F401
    except ImportError:
        yield "OpenVINO", "not installed (the bench extra)"
        return
    yield "OpenVINO fp32", ov_run(str(plain))
    try:
        yield "OpenVINO int8 (NNCF)", ov_run(nncf_int8(plain, feeds))
    except ImportError:
        yield "OpenVINO int8 (NNCF)", "nncf not installed (the bench extra)"
    if flags & {"avx512_bf16", "amx_bf16"}:
        yield "OpenVINO bf16", ov_run(str(plain), "bf16")
    else:
        yield "bf16", "not on this CPU (no avx512_bf16, no amx_bf16)"


def batches(encodings: list[Any], rows: int, count: int) -> list[dict[str, np.ndarray]]:
    """The first `count` texts sorted by length (as the batcher groups them), in batches of
    `rows`, each padded to its longest."""
    chosen = sorted(encodings[:count], key=lambda e: len(e.ids))
    out = []
    for start in range(0, count, rows):
        part = chosen[start : start + rows]
        length = max(len(e.ids) for e in part)
        ids = np.zeros((len(part), length), dtype=np.int64)
        mask = np.zeros_like(ids)
        for r, e in enumerate(part):
            ids[r, : len(e.ids)] = e.ids
            mask[r, : len(e.ids)] = 1
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def texts_per_s(run: Run, feeds: list[dict[str, np.ndarray]]) -> float:
    run(feeds[0])  # warm
    t0 = time.perf_counter()
    for f in feeds:
        run(f)
    return sum(len(f["input_ids"]) for f in feeds) / (time.perf_counter() - t0)


def ci(values: np.ndarray, digits: int) -> str:
    low, high = int8.interval(values)
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=192, help="texts a cell at batch 32")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds; a cell's best is kept")
    p.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    args = p.parse_args(argv)
    os.sched_setaffinity(0, [args.cpu])
    name, flags = cpu()
    print(
        f"CPU: {name}; flags: " + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in FLAGS)
    )
    model_dir = default_artifact_dir()
    m = load_manifest(model_dir)
    tokenizer = load_tokenizer(model_dir, m.max_length)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"model: {model_dir.name}; one thread pinned to cpu {args.cpu}; "
          f"load average {os.getloadavg()[0]:.1f}; {when}")  # fmt: skip
    cells = {kind: tokenizer.encode_batch(ox.read_heldout(path)[0]) for kind, path in TEXTS.items()}
    texts, gold = ox.read_heldout(ox.PUBLICATION)
    publication = tokenizer.encode_batch(texts)
    gold_ids = np.array(gold)
    heads = [f"{k} b{b}" for k in TEXTS for b in BATCHES]
    print(f"texts/s: one thread, best of {args.rounds} rounds; "
          f"publication split: {len(texts)} texts, 95% intervals\n")  # fmt: skip
    print(f"| runtime | {' | '.join(heads)} | agreement with fp32 | accuracy | cost (points) |")
    print("| --- " * (len(heads) + 4) + "|")
    feeds = [batches(cells[k], b, args.texts * SHARE[b] // 4) for k in TEXTS for b in BATCHES]
    with tempfile.TemporaryDirectory() as tmp:
        found = list(runtimes(model_dir, Path(tmp), flags))
        runs = {label: run for label, run in found if not isinstance(run, str)}
        best: dict[str, list[float]] = {label: [0.0] * len(feeds) for label in runs}
        for _ in range(args.rounds):  # rounds alternate the runtimes: a busy spell hits all
            for label, run in runs.items():
                rates = [texts_per_s(run, f) for f in feeds]
                best[label] = [max(a, b) for a, b in zip(best[label], rates, strict=True)]
        base = np.zeros(0)
        base_right = np.zeros(0)
        for label, run in found:
            if isinstance(run, str):
                print(f"| {label} | {run} |")
                continue
            logits = ox.session_logits(Session(run), publication)
            base = logits if base.size == 0 else base  # the first row: ORT fp32 plain
            same = (logits.argmax(1) == base.argmax(1)).astype(np.float64)
            right = (logits.argmax(1) == gold_ids).astype(np.float64)
            base_right = right if base_right.size == 0 else base_right
            cost = 100 * (base_right - right).mean()  # points
            low, high = (100 * v for v in int8.paired_interval(base_right, right))  # paired
            print(f"| {label} | {' | '.join(f'{r:.0f}' for r in best[label])} | "
                  f"{same.mean():.4f} {ci(same, 4)} | {right.mean():.4f} {ci(right, 4)} | "
                  f"{cost:.2f} [{low:.2f}, {high:.2f}] |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
