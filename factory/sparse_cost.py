"""What int8 and bf16 cost a sparse (SPLADE) model, published in its manifest: on a
query-document sample of the publication split (factory/onnx.py PUBLICATION; nothing is chosen on
it: a sparse model's int8 is the one dynamic recipe, bf16 the plain graph compiled by OpenVINO),
how many of each text's top-k terms the precision keeps, and how often its dot products rank the
documents of a query as fp32's do."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.factory import int8
from ringserve.factory import onnx as ox
from ringserve.workers.artifact import open_tokenizer
from ringserve.workers.cpu import BF16_FLAGS, cpu_flags

QUERIES = 64  # the publication split's first rows are the queries ...
DOCUMENTS = 448  # ... the rows after them the documents every query ranks
TERMS_K = 32  # a text's top terms compared
RANK_K = 10  # a query's top documents compared


def sample(tokenizer: Any) -> tuple[list[Any], int]:
    """The sample's encodings (queries first) and its query count; RINGSERVE_INT8_PUBLICATION_ROWS
    (the tests' cheap builds) caps the whole sample, a quarter of it queries."""
    texts, _ = ox.read_heldout(ox.PUBLICATION)
    total = min(QUERIES + DOCUMENTS, int(os.environ.get(int8.PUBLICATION_ROWS_ENV) or len(texts)))
    queries = min(QUERIES, max(1, total // 4))
    return tokenizer.encode_batch(texts[:total]), queries


def term_overlap(a: np.ndarray, b: np.ndarray, k: int = TERMS_K) -> np.ndarray:
    """A row each: the share of fp32's top-k terms (its nonzero ones, when fewer) that `b`'s
    top-k holds."""
    out = np.ones(len(a))
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        n = min(k, int((x > 0).sum()))
        if n:
            top_a = np.argpartition(-x, n - 1)[:n]
            top_b = np.argpartition(-y, n - 1)[:n] if (y > 0).sum() >= n else np.flatnonzero(y)
            out[i] = len(np.intersect1d(top_a, top_b)) / n
    return out


def ranking(a: np.ndarray, b: np.ndarray, queries: int, k: int = RANK_K) -> dict[str, Any]:
    """Each query's documents ranked by dot product under fp32 (`a`) and the precision (`b`):
    the share of fp32's top-k the precision's top-k holds, and how often the top document is
    the same."""
    k = max(1, min(k, len(a) - queries))
    sa = a[:queries] @ a[queries:].T
    sb = b[:queries] @ b[queries:].T
    top_a = np.argsort(-sa, axis=1, kind="stable")[:, :k]
    top_b = np.argsort(-sb, axis=1, kind="stable")[:, :k]
    overlap = np.array([len(np.intersect1d(x, y)) / k for x, y in zip(top_a, top_b, strict=True)])
    first = (top_a[:, 0] == top_b[:, 0]).astype(np.float64)
    return {
        f"rank_overlap_at_{k}": round(float(overlap.mean()), 4),
        f"rank_overlap_at_{k}_ci95": int8.interval(overlap),
        "top1_agreement": round(float(first.mean()), 4),
        "top1_agreement_ci95": int8.interval(first),
    }


def compare(a: np.ndarray, b: np.ndarray, queries: int) -> dict[str, Any]:
    """The published figures of `b` (a precision's pooled weights) against fp32's `a`."""
    terms = term_overlap(a, b)
    dots = (a * b).sum(1) / np.maximum((a * a).sum(1), 1e-12)
    return {
        "texts": len(a),
        "queries": queries,
        "documents": len(a) - queries,
        "split": ox.PUBLICATION_SPLIT,
        f"term_overlap_at_{TERMS_K}": round(float(terms.mean()), 4),
        f"term_overlap_at_{TERMS_K}_ci95": int8.interval(terms),
        "min_term_overlap": round(float(terms.min()), 4),
        "mean_self_dot_ratio": round(float(dots.mean()), 4),  # <b, a> / <a, a>: 1 is fp32's
    } | ranking(a, b, queries)


def precisions(
    plain: Path, work: Path, tokenizer_file: Path, manifest: dict[str, Any]
) -> dict[str, tuple[Path, str]]:
    """Quantize the plain graph to int8 (dynamic, per channel) and publish its cost, then bf16's
    on a CPU that has it; returns the int8 graph for the artifact."""
    tokenizer = open_tokenizer(tokenizer_file, manifest["max_length"])
    encodings, queries = sample(tokenizer)
    chosen = work / ox.INT8_FILE
    ox.quantize_int8(plain, chosen)
    a, fp32_speed = int8.fp32_pass(plain, encodings)
    b = ox.logits_split(chosen, encodings)
    manifest["int8"] = compare(a, b, queries) | {"recipe": "dynamic"}
    if cpu_flags() & set(BF16_FLAGS):
        try:
            manifest["bf16"] = _bf16(plain, encodings, a, fp32_speed, queries)
        except Exception as exc:  # noqa: BLE001 - OpenVINO's errors have no common type
            print(f"ringserve: no bf16 cost in this artifact ({str(exc)[:200]})", file=sys.stderr)
    return {"int8_file": (chosen, ox.INT8_FILE)}


def _bf16(
    plain: Path, encodings: list[Any], a: np.ndarray, fp32_speed: float, queries: int
) -> dict[str, Any]:
    from ringserve.workers.runtimes.openvino import compile_model

    b, speed = int8._timed(int8._Compiled(compile_model(plain, "bf16", 1)), encodings)
    return compare(a, b, queries) | {
        "runtime": "openvino",
        "speedup": round(speed / fp32_speed, 3),
        "texts_per_s": round(speed, 1),
        "fp32_texts_per_s": round(fp32_speed, 1),
    }
