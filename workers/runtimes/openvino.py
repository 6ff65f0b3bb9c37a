"""OpenVINO for the CPU runner: the artifact's plain model.onnx compiled at the precision served
(bf16 on a CPU with AVX512_BF16 or AMX, else f32), in the same buffers and interface as OrtRunner.

openvino is imported only here, when a worker builds this runner (after any fork, as ONNX
Runtime's session is made): a worker on ONNX Runtime or TorchScript never loads it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.workers.batches import BATCH_OVERHEAD
from ringserve.workers.pages import release_file_pages
from ringserve.workers.runtimes.cpu import CpuRunner, softmax
from ringserve.workers.runtimes.onnx_model import TOKENS_OUTPUT

# The inference precision hint of each precision OpenVINO serves.
HINTS = {"bf16": "bf16", "fp32": "f32"}


def compile_model(path: str | Path, precision: str, threads: int, **other: Any) -> Any:
    """The CPU plugin's compiled model of an ONNX file: `threads` inference threads, one
    stream, the latency hint and no pinning of its own (workers and their lanes are pinned by
    ringserve already; OpenVINO's pinning would move the threads it makes off their cores).
    `other`: properties that replace or join these (benchmarks/bf16_ceiling.py's counters and
    streams; a worker passes none)."""
    import openvino as ov

    config = {
        "INFERENCE_PRECISION_HINT": HINTS[precision],
        "INFERENCE_NUM_THREADS": max(1, threads),
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_CPU_PINNING": False,
    } | other
    return ov.Core().compile_model(str(path), "CPU", config)


class OvRunner(CpuRunner):
    """CpuRunner's buffers, run by one OpenVINO infer request. Its inputs are views of the
    buffers (shared, not copied); its outputs are read from the request's own tensors and copied
    once, by the activation, as ONNX Runtime's are."""

    def __init__(
        self,
        compiled: Any,
        max_len: int,
        max_batch: int,
        activation: Callable[[np.ndarray], np.ndarray] = softmax,
        precision: str = "bf16",
        both: bool = False,
        compile_s: float = 0.0,
    ) -> None:
        super().__init__(None, max_len, max_batch, activation)
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        # fp32 on OpenVINO was not fitted: ONNX Runtime fp32's figure stands for it
        self.overhead_tokens = BATCH_OVERHEAD.get(
            ("openvino", precision), BATCH_OVERHEAD["onnx", "fp32"]
        )
        self.both = both  # an embed artifact's second output, the embedding, after the logits
        self.compile_s = compile_s  # what compiling took (the worker's boot)
        names = [o.get_any_name() for o in compiled.outputs]
        self.outputs = [i for i, n in enumerate(names) if n != TOKENS_OUTPUT]
        self.tokens = names.index(TOKENS_OUTPUT) if TOKENS_OUTPUT in names else -1
        self.token_width = 0
        if self.tokens >= 0:
            last = compiled.outputs[self.tokens].get_partial_shape()[-1]
            self.token_width = last.get_length() if last.is_static else 0

    def _infer(self, length: int, n: int) -> Any:
        ids, mask = self.views(length, n)
        feed = {"input_ids": ids, "attention_mask": mask}
        return self.request.infer(feed, share_inputs=True, share_outputs=True)

    def forward(self, length: int, n: int) -> np.ndarray:
        return self.rows(self._infer(length, n))

    def forward_tokens(self, length: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """forward's rows, and the token states [n, length, H] of the same pass."""
        outs = self._infer(length, n)
        return self.rows(outs), np.array(outs[self.tokens], dtype=np.float32)

    def rows(self, outs: Any) -> np.ndarray:
        first = outs[self.outputs[0]]
        logits = np.concatenate([first, outs[self.outputs[1]]], axis=1) if self.both else first
        return self.activation(np.asarray(logits, dtype=np.float32))


def ov_runner(
    spec: Any,
    manifest: Any,
    activation: Callable[[np.ndarray], np.ndarray] = softmax,
    model_dir: str | None = None,
    compiled: Any = None,
) -> OvRunner:
    """The OpenVINO runner of a worker, compiled from the artifact's plain ONNX graph with an
    inference thread for each of the worker's cores (spec.threads a lane, spec.lanes lanes), or
    an infer request of `compiled`, the worker's compiled model of the same artifact.

    A worker of two lanes runs one loop here, not a request a lane: two infer requests of one
    compiled model (one stream) ran one at a time, 462 texts/s together against 526 for one
    (batch 16 x 16 tokens, bf16, AVX512_BF16 EPYC, 2026-12-07), while one request on two
    threads ran 948; a second stream (two threads, two requests) 794."""
    path = Path(model_dir or spec.model_dir) / manifest.onnx_file
    t0 = time.perf_counter()
    if compiled is None:  # a worker of lanes runs one loop, OpenVINO's threads on every core
        compiled = compile_model(path, spec.precision, spec.threads * max(1, spec.lanes))
        release_file_pages([path.parent])
    return OvRunner(
        compiled,
        manifest.max_length,
        spec.max_batch,
        activation,
        spec.precision,
        manifest.embeds and not manifest.embed_only,
        time.perf_counter() - t0,
    )
