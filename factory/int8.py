"""The int8 recipe of an artifact, chosen where it is built: each recipe's agreement with fp32 on
the selection split and its speed on this CPU, and the most faithful among those fast enough;
then the chosen recipe's cost, read once on the publication split, which played no part in the
choice (a recipe graded on the rows it was chosen on looks better than it is: docs/design.md).

Recipes (ONNX Runtime's quantizer, weights int8 per output channel):
- `dynamic`: every weight MatMul, activations quantized per batch at run time;
- `dynamic, fp32 <groups>`: the same with the most sensitive MatMul groups (a group is one
  MatMul of every layer, e.g. all FFN outputs) kept in fp32, ranked by measurement on the
  calibration rows: each group kept alone, the drift of the logits that remains;
- `static QDQ` of the plain and of the fused graph, activation ranges calibrated on
  `calibration.tsv` (300 SST-2 training rows: never the held-out rows the cost is measured on).
"""

from __future__ import annotations

import csv
import multiprocessing
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.factory import onnx as ox
from ringserve.workers.runtimes.checked import close_feed, margins

CALIBRATION = Path(__file__).parent / "default_head" / "calibration.tsv"
MIN_SPEEDUP = 1.3  # a recipe must run this many times fp32's texts/s to be worth its cost
KEEP_GROUPS = 2  # candidates keep the 1 .. KEEP_GROUPS most sensitive groups in fp32
# "full" measures every recipe; "dynamic" builds today's recipe alone and times nothing (the
# tests' tiny artifacts, where the choice is not what is tested: tests/test_int8.py runs "full").
SEARCH_ENV = "RINGSERVE_INT8_SEARCH"
SEARCHES = ("full", "dynamic")
# The publication split's first N rows only (unset: all 3,793). For the tests' builds of artifacts
# whose published figure is not what they test (the build's lock, export's shapes): reading the
# whole split is half of a default build's time. The manifest's `texts` says how many were read.
PUBLICATION_ROWS_ENV = "RINGSERVE_INT8_PUBLICATION_ROWS"
_LAYER = re.compile(r"\.\d+(?=/)")  # '/encoder/layers.3/ffn_out/MatMul' -> group 'layers.*'


@dataclass
class Candidate:
    recipe: str
    path: Path
    row: dict[str, Any] = field(default_factory=dict)  # what was measured of it
    logits: Any = None  # its logits on the selection split (the second look's threshold)


def search_mode() -> str:
    mode = os.environ.get(SEARCH_ENV, "full") or "full"
    if mode not in SEARCHES:
        raise ValueError(f"{SEARCH_ENV} must be one of {', '.join(SEARCHES)}, got {mode!r}")
    return mode


def _rows(path: Path) -> list[str]:
    with path.open(encoding="utf-8", newline="") as f:
        return [r[0] for r in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]


def _feeds(encodings: list[Any]) -> Iterator[dict[str, np.ndarray]]:
    """Length-sorted batches as the session takes them (the calibration reader's input)."""
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
    for start in range(0, len(order), ox.COST_BATCH):
        rows = [encodings[i] for i in order[start : start + ox.COST_BATCH]]
        length = max(len(e.ids) for e in rows)
        ids = np.zeros((len(rows), length), dtype=np.int64)
        mask = np.zeros_like(ids)
        for r, e in enumerate(rows):
            ids[r, : len(e.ids)] = e.ids
            mask[r, : len(e.ids)] = 1
        yield {"input_ids": ids, "attention_mask": mask}


def weight_groups(path: Path) -> dict[str, list[str]]:
    """The MatMuls with a constant weight, by group (the node name with its layer number cut)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    groups: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in weights:
            groups.setdefault(_LAYER.sub(".*", node.name), []).append(node.name)
    return groups


def dynamic(src: Path, dst: Path, keep: Sequence[str] = ()) -> None:
    """Dynamic int8 of every weight MatMul but those named in `keep` (left fp32)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with ox.quiet():
        quantize_dynamic(
            str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
            nodes_to_exclude=list(keep), extra_options={"DefaultTensorType": 1},
        )  # fmt: skip


def static_qdq(src: Path, dst: Path, calibration: list[Any]) -> None:
    """Static QDQ: int8 weights per channel and int8 activations with ranges fixed by the
    calibration rows (min-max)."""
    quantize_qdq(src, dst, _feeds(calibration), unsigned=False)


def quantize_qdq(
    src: Path, dst: Path, feeds: Iterable[dict[str, np.ndarray]], unsigned: bool
) -> None:
    """Static QDQ from calibration feeds: s8 weights per channel, and s8 activations (or u8,
    `unsigned`: the layout VNNI's u8 x s8 dot product takes; benchmarks/runtimes.py)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    activations = QuantType.QUInt8 if unsigned else QuantType.QInt8
    with ox.quiet():
        quantize_static(
            str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
            weight_type=QuantType.QInt8, activation_type=activations,
            extra_options={"WeightSymmetric": True, "DefaultTensorType": 1},
        )  # fmt: skip


def timed_logits(path: Path, encodings: list[Any]) -> tuple[np.ndarray, float]:
    """Logits of every text and the texts/s of that pass (one thread, after one warm batch)."""
    session = ox.open_session(path)
    ox.session_logits(session, encodings[: ox.COST_BATCH])
    t0 = time.perf_counter()
    logits = ox.session_logits(session, encodings)
    return logits, len(encodings) / (time.perf_counter() - t0)


def _drift(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).mean())


@dataclass
class Second:
    """A process that runs `dynamic` beside this one (the quantizer is Python under the GIL),
    spawned, so that nothing of this process's threads is copied into it, and the copy of the
    plain graph it reads (the quantizer writes its shape-inferred model beside its input)."""

    pool: ProcessPoolExecutor
    plain: Path

    def submit(self, dst: Path, keep: Sequence[str] = ()) -> Future[None]:
        return self.pool.submit(dynamic, self.plain, dst, keep)


@contextmanager
def second_quantizer(plain: Path, work: Path) -> Iterator[Second | None]:
    """A Second on a copy of `plain`; None for a graph whose weights are in files beside it
    (then this process quantizes alone)."""
    import onnx

    graph = onnx.load(str(plain), load_external_data=False).graph
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer):
        yield None
        return
    (work / "second").mkdir()
    copy = work / "second" / plain.name
    shutil.copyfile(plain, copy)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield Second(pool, copy)


def _written(made: Future[None], path: Path, calibration: list[Any]) -> np.ndarray:
    made.result()
    return ox.logits_of(path, calibration)


def rank_groups(
    plain: Path,
    work: Path,
    calibration: list[Any],
    pool: ThreadPoolExecutor,
    child: Second | None,
) -> tuple[list[str], dict[str, Path]]:
    """Groups from the most sensitive: int8 everywhere but one group, for each group, and how
    close that comes to fp32 on the calibration rows. Returns the order and each group's file.
    Every other graph is written by `child` while this process writes the next, and each
    graph's pass on the calibration rows runs in `pool` (one thread) once it is written: the
    same files and passes, overlapped."""
    groups = weight_groups(plain)
    base = pool.submit(ox.logits_of, plain, calibration)
    passes: dict[str, Future[np.ndarray]] = {}
    files: dict[str, Path] = {}
    for i, (group, nodes) in enumerate(sorted(groups.items())):
        files[group] = work / f"keep{i}.onnx"
        if i % 2 and child is not None:
            made = child.submit(files[group], nodes)
            passes[group] = pool.submit(_written, made, files[group], calibration)
        else:
            dynamic(plain, files[group], nodes)
            passes[group] = pool.submit(ox.logits_of, files[group], calibration)
    drift = {group: _drift(logits.result(), base.result()) for group, logits in passes.items()}
    return sorted(drift, key=drift.__getitem__), files


def candidates(
    plain: Path, fused: Path | None, work: Path, calibration: list[Any], failed: list[Any]
) -> list[Candidate]:
    """Every recipe's file, built in `work`; a recipe the quantizer cannot apply to this graph
    is listed in `failed` with the reason (dynamic int8 must build: it is the fallback)."""
    out = [Candidate("dynamic", work / "dynamic.onnx")]
    with second_quantizer(plain, work) as child:
        if child is None:
            dynamic(plain, out[0].path)
        else:
            first = child.submit(out[0].path)
        try:
            out += _keep_fp32(plain, work, calibration, child)
        except Exception as exc:  # noqa: BLE001 - the quantizer's errors have no common type
            failed.append({"recipe": "dynamic, fp32 <most sensitive>", "error": str(exc)[:200]})
        if child is not None:
            first.result()  # dynamic int8 must build: it is the fallback
    for graph, src in (("plain", plain), ("fused", fused)):
        if src is None:
            continue
        c = Candidate(f"static QDQ ({graph} graph)", work / f"qdq_{graph}.onnx")
        try:
            static_qdq(src, c.path, calibration)
            out.append(c)
        except Exception as exc:  # noqa: BLE001 - as above
            failed.append({"recipe": c.recipe, "error": str(exc)[:200]})
    return out


def _keep_fp32(
    plain: Path, work: Path, calibration: list[Any], child: Second | None
) -> list[Candidate]:
    """Dynamic int8 with the 1 .. KEEP_GROUPS most sensitive MatMul groups kept fp32."""
    with ThreadPoolExecutor(1) as pool:
        order, files = rank_groups(plain, work, calibration, pool, child)
    groups = weight_groups(plain)
    out = []
    for k in range(1, min(KEEP_GROUPS, len(order)) + 1):
        kept = order[:k]
        path = files[kept[0]] if k == 1 else work / f"keep_top{k}.onnx"
        if k > 1:
            dynamic(plain, path, [n for g in kept for n in groups[g]])
        out.append(Candidate(f"dynamic, fp32 {' + '.join(_short(g) for g in kept)}", path))
    return out


def _short(group: str) -> str:
    """'/encoder/layers.*/ffn_out/MatMul' -> 'ffn_out'."""
    parts = [p for p in group.split("/") if p and p != "MatMul" and "*" not in p]
    return parts[-1] if parts else group


def decisions(logits: np.ndarray, activation: str) -> np.ndarray:
    """What a client decides from the scores: the top label (softmax), or each label's
    yes or no (sigmoid: multi-label models and one-output rerankers)."""
    return logits.argmax(1)[:, None] if activation == "softmax" else logits > 0


def scores(logits: np.ndarray, activation: str) -> np.ndarray:
    return ox.softmax(logits) if activation == "softmax" else 0.5 * (np.tanh(0.5 * logits) + 1)


def measure(
    fp32: dict[str, Path],
    found: list[Candidate],
    tokenizer: Any,
    labels: list[str],
    activation: str,
) -> tuple[Candidate, dict[str, Any], np.ndarray]:
    """Each candidate against fp32 on the selection split; the chosen recipe, the record of the
    choice (the frontier) and fp32's logits there. These figures choose; they are never
    published as the cost."""
    texts, gold = ox.read_heldout()
    encodings = tokenizer.encode_batch(texts)
    gold_ids = np.array(gold)
    speeds = {}
    base = np.zeros(0)
    for graph, path in fp32.items():
        logits, speeds[graph] = timed_logits(path, encodings)
        if graph == "plain":
            base = logits
    fp32_speed = max(speeds.values())  # the fp32 graph a server would pick here
    scored = labels == ["negative", "positive"]  # the split's own labels apply
    for c in found:
        logits, speed = timed_logits(c.path, encodings)
        c.logits = logits
        c.row = _row(c.recipe, logits, base, speed / fp32_speed, activation)
        c.row["texts_per_s"] = round(speed, 1)
        if scored:
            c.row["accuracy_int8"] = round(float((logits.argmax(1) == gold_ids).mean()), 4)
    for c in found:  # int8-checked's figures of each recipe (checked_pick)
        c.row["checked"] = checked_estimate(base, c.logits, activation, c.row, speeds["plain"])
    pick = best(found)
    record = {
        "split": ox.SELECTION_SPLIT,
        "texts": len(texts),
        "recipe": pick.recipe,
        "min_speedup": MIN_SPEEDUP,
        "fp32_texts_per_s": {g: round(s, 1) for g, s in speeds.items()},
        "frontier": [c.row for c in found],
    }
    if scored:
        record["accuracy_fp32"] = round(float((base.argmax(1) == gold_ids).mean()), 4)
    return pick, record, base


def best(found: list[Candidate]) -> Candidate:
    """The most faithful recipe at least MIN_SPEEDUP as fast as fp32; when none is, the most
    faithful that is faster at all; when none is (a tiny model), plain dynamic int8."""
    for least in (MIN_SPEEDUP, 1.0):
        fast = [c for c in found if c.row["speedup"] >= least]
        if fast:
            return max(fast, key=lambda c: (c.row["argmax_agreement"], c.row["speedup"]))
    return found[0]


def checked_estimate(
    fp32: np.ndarray, int8: np.ndarray, activation: str, row: dict[str, Any], plain: float
) -> dict[str, Any]:
    """A recipe under a second look, on the selection split: the threshold that covers its
    disagreements there (second_look), the share of texts it re-runs, and the speedup that
    promises: each text through int8, and that share again through the plain fp32 graph
    (`plain`: its texts/s), against fp32's best (row: the recipe's measured speedup)."""
    look = second_look(fp32, int8, activation)
    int8_speed = row["texts_per_s"]
    fp32_speed = int8_speed / row["speedup"]
    speed = 1.0 / (1.0 / int8_speed + look["rerun_share"] / plain)
    return {
        "threshold": look["threshold"],
        "rerun_share": look["rerun_share"],
        "disagreements": look["disagreements"],
        "speedup_estimate": round(speed / fp32_speed, 3),
    }


def checked_pick(found: list[Candidate]) -> Candidate:
    """int8-checked's graph: the recipe whose second look promises the most speed on the
    selection split (checked_estimate). A second look buys back the decisions a recipe
    changes, so the fastest quantization can serve under one where int8 alone must keep its
    most sensitive MatMuls in fp32; its cost is still read on the publication split."""
    return max(found, key=lambda c: c.row["checked"]["speedup_estimate"])


def _row(
    recipe: str, logits: np.ndarray, base: np.ndarray, speedup: float, activation: str
) -> dict[str, Any]:
    diff = np.abs(scores(logits, activation) - scores(base, activation)).max()
    same = decisions(logits, activation) == decisions(base, activation)
    return {
        "recipe": recipe,
        "argmax_agreement": round(float(same.mean()), 4),
        "max_score_diff": round(float(diff), 4),
        "speedup": round(speedup, 3),
    }


def publication_rows(tokenizer: Any) -> tuple[list[Any], list[int]]:
    """The publication split's encodings and gold labels (its first PUBLICATION_ROWS_ENV rows
    when that is set)."""
    texts, gold = ox.read_heldout(ox.PUBLICATION)
    rows = int(os.environ.get(PUBLICATION_ROWS_ENV) or len(texts))
    return tokenizer.encode_batch(texts[:rows]), gold[:rows]


def publish(
    plain: Path, chosen: Path, tokenizer: Any, labels: list[str], activation: str
) -> dict[str, Any]:
    """What the chosen int8 costs, read once on the publication split, which no choice saw:
    how often its decisions agree with fp32's and, with the default head's labels, both
    accuracies; each with its 95% interval. An embed-only model: how far int8 turns each vector."""
    encodings, gold = publication_rows(tokenizer)
    a, _ = fp32_pass(plain, encodings)
    b = ox.logits_split(chosen, encodings)  # untimed: its batches on two sessions at once
    return compare(a, b, gold, labels, activation)


# The plain graph's pass over the publication rows, timed, kept for the build's next reader:
# int8's publish reads it first, bf16's (publish_bf16) takes it as its fp32 baseline, which
# saves a second fp32 pass (8 s of the default build). Keyed by the file and its mtime.
_FP32_PASSES: dict[tuple[str, int, int], tuple[np.ndarray, float]] = {}


def fp32_pass(plain: Path, encodings: list[Any]) -> tuple[np.ndarray, float]:
    """ONNX Runtime fp32 logits of the publication rows and that pass's texts/s (one thread)."""
    key = (str(plain), plain.stat().st_mtime_ns, len(encodings))
    if key not in _FP32_PASSES:
        _FP32_PASSES.clear()  # one build's graph at a time
        _FP32_PASSES[key] = _timed(ox.open_session(plain), encodings)
    return _FP32_PASSES[key]


class _Compiled:
    """An OpenVINO compiled model behind the one call ox.session_logits makes."""

    def __init__(self, compiled: Any) -> None:
        self.request = compiled.create_infer_request()
        self.first = compiled.outputs[0]

    def run(self, _: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(self.request.infer(feeds)[self.first])]


def _timed(session: Any, encodings: list[Any]) -> tuple[np.ndarray, float]:
    """session_logits of every text and the texts/s of that pass, after one warm batch."""
    ox.session_logits(session, encodings[: ox.COST_BATCH])
    t0 = time.perf_counter()
    logits = ox.session_logits(session, encodings)
    return logits, len(encodings) / (time.perf_counter() - t0)


def publish_bf16(plain: Path, tokenizer: Any, labels: list[str], activation: str) -> dict[str, Any]:
    """What bf16 costs, on a CPU that has it: the plain graph compiled by OpenVINO with the
    bf16 hint (as workers/runtimes/openvino.py serves it) against ONNX Runtime's fp32 on the
    same publication rows, with publish's figures, and its speed against that fp32 pass (one
    thread each, after a warm batch; the fp32 pass is the one int8's publish timed)."""
    from ringserve.workers.runtimes.openvino import compile_model

    encodings, gold = publication_rows(tokenizer)
    a, fp32_speed = fp32_pass(plain, encodings)  # int8's publish read it already
    b, speed = _timed(_Compiled(compile_model(plain, "bf16", 1)), encodings)
    cost = compare(a, b, gold, labels, activation, "bf16")
    return cost | {
        "runtime": "openvino",
        "speedup": round(speed / fp32_speed, 3),
        "texts_per_s": round(speed, 1),
        "fp32_texts_per_s": round(fp32_speed, 1),
    }


def compare(
    a: np.ndarray,
    b: np.ndarray,
    gold: list[int],
    labels: list[str],
    activation: str,
    precision: str = "int8",
) -> dict[str, Any]:
    """The cost of `b`'s outputs against fp32's `a` on the publication rows (publish's)."""
    cost: dict[str, Any] = {"texts": len(a), "split": ox.PUBLICATION_SPLIT}
    if not labels:
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        cos = (a * b).sum(1) / np.maximum(norms, 1e-12)
        return cost | {
            "min_cosine": round(float(cos.min()), 4),
            "mean_cosine": round(float(cos.mean()), 4),
            "mean_cosine_ci95": interval(cos),
        }
    same = (decisions(a, activation) == decisions(b, activation)).ravel()  # each decision
    diff = np.abs(scores(a, activation) - scores(b, activation)).max()
    cost |= {
        "argmax_agreement": round(float(same.mean()), 4),
        "argmax_agreement_ci95": interval(same.astype(np.float64)),
        "max_score_diff": round(float(diff), 4),
    }
    if labels == ["negative", "positive"]:
        right32 = (a.argmax(1) == np.array(gold)).astype(np.float64)
        right8 = (b.argmax(1) == np.array(gold)).astype(np.float64)
        cost |= {
            "accuracy_fp32": round(float(right32.mean()), 4),
            f"accuracy_{precision}": round(float(right8.mean()), 4),
            "accuracy_cost": round(float((right32 - right8).mean()), 4),
            # paired: the same texts through both graphs, so the interval is of the differences
            "accuracy_cost_ci95": paired_interval(right32, right8),
        }
    return cost


Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


def interval(values: np.ndarray) -> list[float]:
    """The mean's 95% interval. Values each 0 or 1 (a share: agreement, texts re-run) get
    Wilson's score interval, which stays inside [0, 1] and does not shrink to a point when
    every text agrees (3,793 of 3,793: [0.999, 1.0], where the normal approximation said
    [1.0, 1.0]); other values (cosines, overlaps) the normal approximation (n is in the
    thousands here). A paired difference of two shares is paired_interval's."""
    n = len(values)
    if n == 0:
        return [0.0, 0.0]
    if set(np.unique(values).tolist()) <= {0.0, 1.0}:
        k = float(values.sum())
        z2 = Z95 * Z95
        center = (k + z2 / 2) / (n + z2)
        half = Z95 / (n + z2) * float(np.sqrt(k * (n - k) / n + z2 / 4))
        return [round(max(0.0, center - half), 4), round(min(1.0, center + half), 4)]
    half = Z95 * float(values.std(ddof=1)) / float(np.sqrt(n)) if n > 1 else 0.0
    mean = float(values.mean())
    return [round(mean - half, 4), round(mean + half, 4)]


def paired_interval(first: np.ndarray, second: np.ndarray) -> list[float]:
    """The 95% interval of mean(first - second), two shares (each value 0 or 1) of the same
    texts: an accuracy cost, the texts through both graphs. Bonett and Price's adjusted Wald
    interval for paired proportions (one success added to each discordant cell), which does not
    shrink to a point when no text changes (3,793 texts, none changed: [-0.0007, 0.0007])."""
    n = len(first)
    if n == 0:
        return [0.0, 0.0]
    up = float(((first > 0.5) & (second < 0.5)).sum())  # right under the first graph only
    down = float(((first < 0.5) & (second > 0.5)).sum())
    a, b = (up + 1) / (n + 2), (down + 1) / (n + 2)
    diff = a - b
    half = Z95 * float(np.sqrt(max(a + b - diff * diff, 0.0) / (n + 2)))
    return [round(max(-1.0, diff - half), 4), round(min(1.0, diff + half), 4)]


@dataclass
class Choice:
    """What the recipe search ships: int8's graph (a file in the build's work folder), its
    cost as published (the publication split), the record of how it was chosen (the selection
    split's frontier, with the second look's choice in record["second_look"]) and
    int8-checked's graph (checked_pick: int8's own file, or a faster recipe's)."""

    path: Path
    cost: dict[str, Any]
    record: dict[str, Any]
    checked: Path


def choose(
    plain: Path,
    fused: Path | None,
    work: Path,
    tokenizer: Any,
    labels: list[str],
    activation: str = "softmax",
) -> Choice:
    """int8's graph and int8-checked's, chosen on the selection split (Choice)."""
    mode = search_mode()
    failed: list[Any] = []
    if mode == "dynamic":
        found = [Candidate("dynamic", work / "dynamic.onnx")]
        dynamic(plain, found[0].path)
    else:
        calibration = tokenizer.encode_batch(_rows(CALIBRATION))
        found = candidates(plain, fused, work, calibration, failed)
    fp32 = {"plain": plain}
    if fused is not None and mode == "full":  # fp32's speed: the faster graph of the two
        fp32["fused"] = fused
    pick, record, base = measure(fp32, found, tokenizer, labels, activation)
    cost = publish(plain, pick.path, tokenizer, labels, activation)
    cost |= {"recipe": pick.recipe, "speedup": pick.row["speedup"], "search": mode}
    look = checked_pick(found)
    record["second_look"] = second_look(base, look.logits, activation) | {
        "recipe": look.recipe,
        "speedup_estimate": look.row["checked"]["speedup_estimate"],
    }
    return Choice(pick.path, cost, record | {"failed": failed}, look.path)


def second_look(fp32: np.ndarray, int8: np.ndarray, activation: str) -> dict[str, Any]:
    """int8-checked's threshold, chosen on the selection split: just above the largest int8
    margin (workers/runtimes/checked.py) of a text whose decision int8 changed, so that every
    disagreement of the split would have been looked at again, rounded up to 0.01. Its cost is
    read on the publication split (publish_checked), never here."""
    margin = margins(scores(int8, activation), activation)
    changed = (decisions(fp32, activation) != decisions(int8, activation)).any(axis=1)
    widest = float(margin[changed].max()) if changed.any() else None
    threshold = 0.0 if widest is None else float(np.ceil((widest + 1e-9) * 100) / 100)
    return {
        "threshold": threshold,
        "split": ox.SELECTION_SPLIT,
        "texts": len(fp32),
        "disagreements": int(changed.sum()),
        "rerun_share": round(float((margin < threshold).mean()), 4),
    }


def publish_checked(
    plain: Path,
    chosen: Path,
    tokenizer: Any,
    labels: list[str],
    activation: str,
    threshold: float,
) -> dict[str, Any]:
    """What int8-checked costs, read once on the publication split: publish's figures for the
    answers it gives (fp32's scores for a text whose int8 margin is under `threshold`, int8's
    for the rest), the share of texts it re-runs, and its speed against the fp32 pass, timed
    as a worker runs it: each batch through int8, then its close calls through fp32 at their
    own longest length (checked.close_feed), one thread each."""
    encodings, gold = publication_rows(tokenizer)
    a, fp32_speed = fp32_pass(plain, encodings)  # int8's publish read it already
    int8_s, fp32_s = ox.open_session(chosen), ox.open_session(plain)
    batches = ox.length_batches(encodings)
    out: list[np.ndarray] = [np.zeros(0)] * len(encodings)
    rerun = np.zeros(len(encodings), dtype=bool)

    def run(part: list[tuple[list[int], dict[str, np.ndarray]]]) -> None:
        for rows, feed in part:
            logits = np.asarray(int8_s.run(None, feed)[0], dtype=np.float32)
            close = margins(scores(logits, activation), activation) < threshold
            if close.any():
                at, sub = close_feed(feed["input_ids"], feed["attention_mask"], close)
                logits[at] = np.asarray(fp32_s.run(None, sub)[0], dtype=np.float32)
            for r, i in enumerate(rows):
                out[i], rerun[i] = logits[r], close[r]

    run(batches[:1])  # a warm batch, as every timed pass here has
    t0 = time.perf_counter()
    run(batches)
    speed = len(encodings) / (time.perf_counter() - t0)
    b = np.stack(out)
    cost = compare(a, b, gold, labels, activation, "int8_checked")
    return cost | {
        "threshold": threshold,
        "rerun_share": round(float(rerun.mean()), 4),
        "rerun_share_ci95": interval(rerun.astype(np.float64)),
        "speedup": round(speed / fp32_speed, 3),
        "texts_per_s": round(speed, 1),
        "fp32_texts_per_s": round(fp32_speed, 1),
    }


def cleanup(work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
