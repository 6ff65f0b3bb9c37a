"""Compact vectors at build time: the calibration an embed artifact's int8 and uint8 vectors are
cut by (per-dimension minimum and maximum of the model's own vectors over a fixed set of texts,
as sentence-transformers' `quantize_embeddings(calibration_embeddings=...)` takes them), and
what int8 and binary vectors cost a search (recall@10 against float on held-out queries and
documents, with rescoring and without). Both go into the manifest's `extra.compact`; the
serving side is service/protocols/compact.py.

Two disjoint sets shipped with the package (factory/retrieval/, drawn from data/): the
calibration texts (500 AG News descriptions, 500 SST-2 sentences) set the ranges, and the
held-out sample (1,100 AG News descriptions as documents, 100 queries made of the first eight
words of 100 of them) is read once, after, to publish the cost."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent / "retrieval"
CALIBRATION = HERE / "calibration.tsv"
HELDOUT = HERE / "heldout.tsv"
CALIBRATION_SOURCE = (
    "factory/retrieval/calibration.tsv: data/ag_news/sample.tsv rows 1-500 and "
    "data/sst2/sample.tsv rows 1-500"
)
HELDOUT_SOURCE = (
    "factory/retrieval/heldout.tsv: documents data/ag_news/sample.tsv rows 1001-2100, queries "
    "the first eight words of rows 2001-2100 (no row of the calibration set)"
)
# The calibration set's first N texts and the held-out sample's last N documents only (unset: all;
# every query is kept, and the last documents are the ones the queries were cut from). For the
# tests' builds of artifacts whose published figures are not what they test: at all 2,200 texts
# it is nine tenths of a MiniLM export's time. The manifest's `texts` and `documents` say how
# many were read.
ROWS_ENV = "RINGSERVE_COMPACT_ROWS"
TOP = 10  # recall@10
RESCORE = 4  # rescoring re-ranks the first RESCORE x TOP candidates with the float query
Embed = Callable[[list[str]], np.ndarray]  # texts -> their served float32 vectors [N, D]


def read_texts(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]


def calibration_ranges(vectors: np.ndarray) -> np.ndarray:
    """[2, D] float32: each dimension's minimum, then maximum (quantize_embeddings' ranges)."""
    return np.vstack((vectors.min(axis=0), vectors.max(axis=0))).astype(np.float32)


def int8_of(vectors: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """int8 vectors as sentence-transformers cuts them (the serving side's compact.quantize)."""
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    return (np.clip(np.floor((vectors - starts) / steps), 0, 255) - 128).astype(np.int8)


def bits_of(vectors: np.ndarray) -> np.ndarray:
    """Each dimension's sign as +1 / -1, the value a binary vector's bit stands for."""
    return np.where(vectors > 0, 1.0, -1.0).astype(np.float32)


def recall(
    q: np.ndarray, d: np.ndarray, truth: np.ndarray, rescore: tuple[np.ndarray, np.ndarray] | None
) -> float:
    """Mean share of the float top-10 (`truth`) found in the top-10 by scores q @ d.T; with
    `rescore` (float queries, the documents' compact vectors read back), the first RESCORE x
    TOP candidates re-ranked by the float query."""
    scores = q.astype(np.float32) @ d.T.astype(np.float32)
    if rescore is None:
        found = np.argsort(-scores, axis=1, kind="stable")[:, :TOP]
    else:
        fq, back = rescore
        wide = np.argsort(-scores, axis=1, kind="stable")[:, : RESCORE * TOP]
        again = np.einsum("qd,qkd->qk", fq, back[wide])
        found = np.take_along_axis(wide, np.argsort(-again, axis=1, kind="stable"), 1)[:, :TOP]
    hits = [len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist(), strict=True)]
    return round(float(np.mean(hits)) / TOP, 4)


def retrieval_cost(queries: np.ndarray, docs: np.ndarray, ranges: np.ndarray) -> dict[str, Any]:
    """recall@10 of int8 and binary search (dot products of the served vectors, cut) against
    float search (cosine), with rescoring and without."""
    truth = np.argsort(-(cosine(queries) @ cosine(docs).T), axis=1, kind="stable")[:, :TOP]
    qi, di = int8_of(queries, ranges), int8_of(docs, ranges)
    starts = ranges[0]
    steps = np.where(ranges[1] == starts, 1, (ranges[1] - starts) / 255)
    back_int8 = starts + (di.astype(np.float32) + 128.5) * steps  # each bucket's middle
    qb, db = bits_of(queries), bits_of(docs)
    return {
        "int8": recall(qi, di, truth, None),
        "int8_rescored": recall(qi, di, truth, (queries, back_int8)),
        "binary": recall(qb, db, truth, None),  # Hamming order: the dot of +1/-1 vectors
        "binary_rescored": recall(qb, db, truth, (queries, db)),
    }


def compact_facts(embed: Embed) -> dict[str, Any]:
    """The manifest's `extra.compact`: the calibration ranges and the retrieval cost."""
    calibration = [r[0] for r in read_texts(CALIBRATION)]
    rows = read_texts(HELDOUT)
    documents = [t for kind, t in rows if kind == "document"]
    keep = int(os.environ.get(ROWS_ENV) or max(len(calibration), len(documents)))
    calibration, documents = calibration[:keep], documents[-keep:]
    ranges = calibration_ranges(embed(calibration))
    queries = embed([t for kind, t in rows if kind == "query"])
    docs = embed(documents)
    cost = retrieval_cost(queries, docs, ranges)
    return {
        "calibration": {
            "min": [float(x) for x in ranges[0]],  # float32 values, exact in JSON
            "max": [float(x) for x in ranges[1]],
            "texts": len(calibration),
            "source": CALIBRATION_SOURCE,
        },
        "recall_at_10": {
            **cost,
            "queries": len(queries),
            "documents": len(docs),
            "rescored_from": RESCORE * TOP,
            "source": HELDOUT_SOURCE,
        },
    }


def cosine(vectors: np.ndarray) -> np.ndarray:
    """Unit vectors (the ground truth's cosine order; compact search takes them as served)."""
    norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return (vectors / norms).astype(np.float32)


def onnx_embedder(graph: Path, tokenizer: Any, normalize: bool) -> Embed:
    """Texts -> the vectors an artifact's plain ONNX graph serves (its `embedding` output, L2
    normalized when the model normalizes): what the front-end answers at fp32. The batches are
    dealt between two one-thread sessions running at once (ox.split_run: each batch's vectors
    are those one session gives, to the byte; the default build's three passes took 20 s on
    one)."""
    from ringserve.factory import onnx as ox

    sessions = [ox.open_session(graph) for _ in range(2)]

    def embed(texts: list[str]) -> np.ndarray:
        got = ox.split_run(sessions, tokenizer.encode_batch(texts), "embedding")
        return cosine(got) if normalize else got

    return embed
