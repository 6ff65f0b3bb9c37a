"""OpenVINO against ONNX Runtime on the artifact's own model.onnx: texts/s on one pinned core
over the 1,000 held-out texts in length-sorted batches of 32 (as the artifact build times its
graphs), and the largest logit drift from ONNX Runtime's. Two rounds, alternating.

OpenVINO is not a dependency (docs/design.md says why: never faster here at fp32); to rerun:
`pip install openvino`, then `python -m benchmarks.openvino_check`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
from ringserve.factory import int8
from ringserve.factory import onnx as ox
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import load_manifest, load_tokenizer


class OvSession:
    """An OpenVINO compiled model behind the one call session_logits makes."""

    def __init__(self, path: str, precision: str) -> None:
        import openvino as ov

        core = ov.Core()
        hints = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
        if precision:
            hints["INFERENCE_PRECISION_HINT"] = precision
        self.model = core.compile_model(path, "CPU", hints)
        self.request = self.model.create_infer_request()

    def run(self, _: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [self.request.infer(feeds)[self.model.outputs[0]]]


def main() -> int:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[-1:])
    model_dir = default_artifact_dir()
    m = load_manifest(model_dir)
    encodings = load_tokenizer(model_dir, m.max_length).encode_batch(ox.read_heldout()[0])
    rates: dict[str, list[float]] = {}
    base = np.zeros(0)
    for _ in range(2):
        for graph in ("plain", "fused"):
            logits, rate = int8.timed_logits(model_dir / m.onnx_for("fp32", graph), encodings)
            rates.setdefault(f"onnxruntime {graph}", []).append(rate)
            base = logits if graph == "plain" else base
        for precision in ("f32", ""):  # "": OpenVINO's own default (bf16 where the CPU has it)
            session = OvSession(str(model_dir / m.onnx_file), precision)
            ox.session_logits(session, encodings[:32])
            t0 = time.perf_counter()
            logits = ox.session_logits(session, encodings)
            name = f"openvino {precision or 'default precision'}"
            rates.setdefault(name, []).append(len(encodings) / (time.perf_counter() - t0))
            print(f"{name}: largest logit drift from onnxruntime {np.abs(logits - base).max():.2g}")
    for name, r in rates.items():
        print(f"{name}: {' '.join(f'{x:.0f}' for x in r)} texts/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
