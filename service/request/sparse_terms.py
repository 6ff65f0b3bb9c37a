"""A sparse model's answers as every wire gives them: each text's nonzero terms (vocabulary ids,
ascending, and their weights) read from its ring answer (shm/layout.py RSP_SPARSE), pruned on
request (`top_k`, `threshold`), and KServe's three outputs (`sparse_indices`, `sparse_values`,
`sparse_lengths`: the texts' terms one after another, and how many terms each text has)."""

from __future__ import annotations

from typing import Any

import numpy as np
from ringserve.service.engine.requests import Result

INDICES, VALUES, LENGTHS = "sparse_indices", "sparse_values", "sparse_lengths"
OUTPUTS = (INDICES, VALUES, LENGTHS)  # KServe's, in metadata's order
DATATYPES = {INDICES: "INT32", VALUES: "FP32", LENGTHS: "INT32"}
CONFIG_TYPES = {INDICES: "TYPE_INT32", VALUES: "TYPE_FP32", LENGTHS: "TYPE_INT32"}


def terms(r: Result) -> tuple[np.ndarray, np.ndarray]:
    """A text's term ids (uint32, ascending) and their weights (float32)."""
    floats = np.asarray(r.scores)
    n = len(floats) // 2
    return floats[:n].view("<u4"), floats[n:]


def pruned(
    ids: np.ndarray, values: np.ndarray, top_k: int | None, threshold: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """The terms whose weight passes `threshold` (strictly above it), then the heaviest `top_k`
    of them (ties to the lower id), still ascending by id."""
    if threshold is not None:
        keep = values > threshold
        ids, values = ids[keep], values[keep]
    if top_k is not None and len(ids) > top_k:
        order = np.sort(np.argsort(-values, kind="stable")[:top_k])
        ids, values = ids[order], values[order]
    return ids, values


def kserve_tensor(name: str, results: list[Result], binary: bool) -> tuple[dict[str, Any], Any]:
    """One of KServe's sparse outputs: its tensor's head, and its data (raw bytes when
    `binary`, else a flat list)."""
    parts = [terms(r) for r in results]
    if name == LENGTHS:
        data = np.array([len(ids) for ids, _ in parts], dtype="<i4")
    elif name == INDICES:
        data = np.concatenate([ids for ids, _ in parts]).astype("<i4")
    else:
        data = np.concatenate([values for _, values in parts]).astype("<f4", copy=False)
    head = {"name": name, "datatype": DATATYPES[name], "shape": [len(data)]}
    return head, data.tobytes() if binary else data.tolist()


def kserve_outputs(kind: str, dims: str, types: dict[str, str]) -> list[dict[str, Any]]:
    """The three outputs as metadata (`datatype`, `shape`) or the configuration (`data_type`,
    `dims`) names them: each a flat tensor of any length."""
    return [{"name": name, kind: types[name], dims: [-1]} for name in OUTPUTS]
