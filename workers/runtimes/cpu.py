"""Runs CPU batches, through TorchScript or ONNX Runtime, from input buffers allocated once.

torch is imported only by the TorchScript runner: a worker on ONNX Runtime never loads it (nor
does its zygote), which keeps about 100 MiB of torch's pages out of the process tree."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from ringserve.workers.batches import BATCH_OVERHEAD, Item
from ringserve.workers.runtimes.onnx_model import TOKENS_OUTPUT, fetched_outputs, token_width


class Runner(Protocol):
    """What a worker's serving loop needs of a model runtime, on any device: copy a batch into
    its buffers padded to `length` (returns the real token count), run the first `n` rows (scores
    [n, C]), and warm up before the worker says ready (returns the seconds it took)."""

    def fill(self, length: int, batch: list[Item]) -> int: ...

    def forward(self, length: int, n: int) -> np.ndarray: ...

    def warm(self) -> float: ...

    @property
    def overhead_tokens(self) -> int: ...


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out.astype(np.float32, copy=False)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Independent probabilities: multi-label models and one-output rerankers."""
    out: np.ndarray = 0.5 * (np.tanh(0.5 * logits) + 1.0)  # no overflow for large |logits|
    return out.astype(np.float32, copy=False)


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": softmax,
    "sigmoid": sigmoid,
}


def joined(
    activation: Callable[[np.ndarray], np.ndarray], n_labels: int
) -> Callable[[np.ndarray], np.ndarray]:
    """For an embed model's one output [n, C + D]: scores from the first C columns, the
    embedding's D floats kept as they are, so one runner call answers both tasks."""

    def apply(out: np.ndarray) -> np.ndarray:
        rows = np.array(out, dtype=np.float32)  # a copy: runners reuse their output buffers
        if n_labels:  # an embed-only model (factory/embedder.py) has no scores at all
            rows[:, :n_labels] = activation(rows[:, :n_labels])
        return rows

    return apply


def answer_activation(
    manifest: Any, first: Callable[[np.ndarray], np.ndarray] | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """What a worker applies to a runner's output rows for this artifact: `first` (the
    manifest's activation by default) on the label columns, an embed model's embedding and a
    sparse model's weights kept as the graph gives them (joined)."""
    activation = first or ACTIVATIONS[manifest.activation]
    if manifest.embeds:  # one output holds both answers: logits, then the embedding
        activation = joined(activation, len(manifest.labels))
    if manifest.sparse:  # the pooled weights as the graph gives them (a copy)
        activation = joined(activation, 0)
    return activation


def fill_rows(ids: np.ndarray, mask: np.ndarray, batch: list[Item]) -> int:
    """Write a batch's token ids and mask into the first rows of preallocated buffers; returns
    the real token count. Rows are cleared first so padding is always id 0, mask 0."""
    n = len(batch)
    ids[:n] = 0
    mask[:n] = 0
    tokens = 0
    for row, item in enumerate(batch):
        k = len(item.ids)
        ids[row, :k] = item.ids
        mask[row, :k] = 1
        if item.types is not None:  # a pair on a model with token types: 2 marks segment B;
            mask[row, :k] += item.types  # -1 a ColBERT query's unattended expansion (mask 0)
        tokens += k
    return tokens


class CpuRunner:
    """Eager TorchScript on the CPU. A batch of n texts padded to `length` tokens is the first
    n x length entries of flat buffers made once for the largest batch, viewed as one contiguous
    [n, length] array (numpy and torch share the memory), so no input is allocated per batch.

    Interface shared with the CUDA runners: fill(length, items) -> real tokens,
    forward(length, n) -> float32 probabilities [n, C], warm() -> seconds."""

    device = "cpu"
    overhead_tokens = BATCH_OVERHEAD["torch", "fp32"]

    def __init__(
        self,
        model: Any,
        max_len: int,
        max_batch: int,
        activation: Callable[[np.ndarray], np.ndarray] = softmax,
    ) -> None:
        self.model = model
        self.activation = activation  # logits -> scores, from the manifest
        self.max_len = max_len
        self.max_batch = max_batch
        size = max_len * max_batch
        self.ids = np.zeros(size, dtype=np.int64)
        self.mask = np.zeros(size, dtype=np.int64)
        if model is not None:  # TorchScript: torch views of the same buffers
            import torch

            self.ids_t = torch.from_numpy(self.ids)
            self.mask_t = torch.from_numpy(self.mask)

    def views(self, length: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n * length > self.ids.size or length > self.max_len:
            raise ValueError(f"a batch of {n} x {length} tokens exceeds the runner's buffers")
        k = n * length
        return self.ids[:k].reshape(n, length), self.mask[:k].reshape(n, length)

    def fill(self, length: int, batch: list[Item]) -> int:
        """Copy token ids into the buffers as [len(batch), length]; returns the real tokens."""
        ids, mask = self.views(length, len(batch))
        return fill_rows(ids, mask, batch)

    def forward(self, length: int, n: int) -> np.ndarray:
        import torch

        k = n * length
        with torch.inference_mode():
            logits = self.model(self.ids_t[:k].view(n, length), self.mask_t[:k].view(n, length))
        return self.activation(logits.float().numpy())

    def warm(self) -> float:
        """Run one short batch before the worker says ready. The slow first calls of a fresh
        TorchScript model (docs/design.md) are the profiling executor's, which the worker turns off
        on the CPU (served.set_graph_optimize): measured without it, the first call
        on 16 tokens took 0.027-0.034 s against 0.020 steady, so more warming buys nothing and
        costs a replacement worker its boot time (a call on the longest length took 0.3-1 s
        under load)."""
        t0 = time.perf_counter()
        ids, mask = self.views(min(16, self.max_len), 1)
        ids[:] = 101
        mask[:] = 1
        self.forward(ids.shape[1], 1)
        return time.perf_counter() - t0


class OrtRunner(CpuRunner):
    """The same buffers and interface, run by an ONNX Runtime session (fp32 or int8)."""

    def __init__(
        self,
        session: Any,
        max_len: int,
        max_batch: int,
        activation: Callable[[np.ndarray], np.ndarray] = softmax,
        precision: str = "fp32",
        both: bool = False,
    ) -> None:
        super().__init__(None, max_len, max_batch, activation)
        self.session = session
        self.overhead_tokens = BATCH_OVERHEAD["onnx", precision]
        # `both`: an embed artifact's second output, the embedding, joined to the logits (as
        # workers/runtimes/joined.py Joined does for TorchScript); else the logits alone.
        self.both = both
        # Named, so that the token states an embed graph also has are copied out only by
        # forward_tokens (onnx_model.TOKENS_OUTPUT).
        self.outputs = fetched_outputs(session)
        self.token_width = token_width(session)  # H, or 0: no token vectors (/embed_all)
        # The same graph on every core of the worker (--lone-cores), for a text alone: a batch
        # of one while no other lane runs (`alone`, set by the worker before each forward). A
        # lone short text's forward ran 1.40x faster on two threads than on one, a long one's
        # 1.34x; a batch of many on both cores slowed the other lane's next batch (c=32, long
        # texts: 0.93 of the ceiling against 0.99).
        self.duo: Any = None
        self.alone = False

    def forward(self, length: int, n: int) -> np.ndarray:
        ids, mask = self.views(length, n)
        session = self.duo if self.alone and self.duo is not None else self.session
        outs = session.run(self.outputs, {"input_ids": ids, "attention_mask": mask})
        return self.rows(outs)

    def forward_tokens(self, length: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """forward's rows, and the token states [n, length, H] of the same pass (a batch in
        which a text asked for its token vectors)."""
        ids, mask = self.views(length, n)
        feed = {"input_ids": ids, "attention_mask": mask}
        outs = self.session.run([*self.outputs, TOKENS_OUTPUT], feed)
        return self.rows(outs[:-1]), np.asarray(outs[-1], dtype=np.float32)

    def rows(self, outs: list[Any]) -> np.ndarray:
        logits = np.concatenate(outs[:2], axis=1) if self.both else outs[0]
        return self.activation(np.asarray(logits, dtype=np.float32))


def ort_runner(
    spec: Any,
    manifest: Any,
    activation: Callable[[np.ndarray], np.ndarray] = softmax,
    model_dir: str | None = None,
    like: OrtRunner | None = None,
) -> OrtRunner:
    """The ONNX Runtime runner of a worker: fp32 (plain or fused graph) or int8, from the
    ONNX files of the artifact at `model_dir` (default: the spec's); with `like`, another
    lane's runner of the same model, whose session it shares (served.py `Loader._runner`)."""
    from ringserve.workers.runtimes.onnx_model import open_session

    path = Path(model_dir or spec.model_dir) / manifest.onnx_for(spec.precision, spec.graph)
    session = like.session if like is not None else open_session(path, spec.threads)
    runner = OrtRunner(
        session,
        manifest.max_length,
        spec.max_batch,
        activation,
        spec.precision,
        manifest.embeds and not manifest.embed_only,
    )
    if spec.lone_cores and spec.lanes > 1:
        # Made on the worker's thread before the lanes pin theirs: its pool's thread may run
        # on any of the worker's cores, and finds the one the calling lane leaves idle.
        runner.duo = like.duo if like is not None else open_session(path, spec.threads * spec.lanes)
    return runner
