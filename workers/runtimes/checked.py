"""`--precision int8-checked`: int8 answers every text, and a text whose int8 answer is a close
call is scored again by fp32 in the same forward call, whose scores it then gets.

int8's disagreements with fp32 sit near the decision boundary (on the default model's selection
split, 14 of 1,000 texts, every one of them with an int8 margin under 0.14), so a second look at
the few close calls buys back fp32's decisions for a fraction of fp32's cost. The threshold is
chosen where the artifact is built, on the selection split, and its cost (agreement, accuracy,
share of texts re-run, speed) published from the publication split (factory/int8.py
`second_look`, `publish_checked`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.workers.runtimes.cpu import OrtRunner, softmax


def margins(scores: np.ndarray, activation: str) -> np.ndarray:
    """How far each row's decision is from changing, on a 0-1 scale: the top probability less
    the second (softmax), or twice the nearest label's distance from 0.5 (sigmoid: multi-label
    models and one-output rerankers, whose decisions are each label's yes or no)."""
    if activation == "sigmoid":
        out: np.ndarray = 2.0 * np.abs(scores - 0.5).min(axis=1)
        return out
    if scores.shape[1] < 2:
        return np.ones(len(scores), dtype=np.float32)
    top = np.partition(scores, -2, axis=1)
    out = top[:, -1] - top[:, -2]
    return out


def close_feed(
    ids: np.ndarray, mask: np.ndarray, close: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The close rows of a batch and their fp32 feed, cut to the longest of those rows (rows
    are right padded): the batch's longest text is rarely a close call, and fp32 pays for every
    padded column."""
    rows = np.flatnonzero(close)
    used = np.flatnonzero((mask[rows] != 0).any(axis=0))
    length = int(used[-1]) + 1 if len(used) else 1
    return rows, {"input_ids": ids[rows, :length], "attention_mask": mask[rows, :length]}


class CheckedRunner(OrtRunner):
    """OrtRunner on the int8 graph, with an fp32 session of the plain graph beside it for the
    rows whose margin is under `threshold`. `checked` is the last forward's rows that fp32
    scored (the worker's answers say so, text by text: shm/layout.py RSP_SECOND_LOOK)."""

    def __init__(
        self,
        session: Any,
        fp32: Any,
        threshold: float,
        n_labels: int,
        decide: str,
        max_len: int,
        max_batch: int,
        activation: Callable[[np.ndarray], np.ndarray] = softmax,
        both: bool = False,
    ) -> None:
        super().__init__(session, max_len, max_batch, activation, "int8-checked", both)
        self.fp32 = fp32
        self.threshold = threshold
        self.n_labels = n_labels
        self.decide = decide  # the manifest's activation: how a row's decision is read
        self.checked = np.zeros(0, dtype=bool)

    def forward(self, length: int, n: int) -> np.ndarray:
        probs = super().forward(length, n)
        close = margins(probs[:, : self.n_labels], self.decide) < self.threshold
        self.checked = close
        if close.any():
            rows, feed = close_feed(*self.views(length, n), close)
            probs[rows] = self.rows(self.fp32.run(self.outputs, feed))
        return probs

    def forward_tokens(self, length: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        probs, states = super().forward_tokens(length, n)
        self.checked = np.zeros(n, dtype=bool)  # token vectors: int8's, as asked of int8
        return probs, states


def checked_runner(
    spec: Any,
    manifest: Any,
    activation: Callable[[np.ndarray], np.ndarray],
    model_dir: str | None = None,
    like: CheckedRunner | None = None,
) -> CheckedRunner:
    """A worker's int8-checked runner: the int8 graph and the plain fp32 graph of the artifact
    at `model_dir` (default: the spec's), with the threshold its build published; with `like`,
    another lane's runner of the same model, both its sessions (cpu.ort_runner)."""
    from ringserve.workers.runtimes.onnx_model import open_session

    where = Path(model_dir or spec.model_dir)
    if like is not None:
        int8, fp32 = like.session, like.fp32
    else:
        int8 = open_session(where / manifest.onnx_for("int8-checked"), spec.threads)
        fp32 = open_session(where / manifest.onnx_file, spec.threads)
    return CheckedRunner(
        int8,
        fp32,
        float(manifest.int8_checked["threshold"]),
        len(manifest.labels),
        manifest.activation,
        manifest.max_length,
        spec.max_batch,
        activation,
        manifest.embeds and not manifest.embed_only,
    )
