"""ONNX Runtime for the CPU runner: open a session on one of the artifact's graphs, and choose
the runtime (TorchScript or ONNX Runtime) a worker serves with. Exporting, fusing and
quantizing the graphs is factory/onnx.py's."""

from __future__ import annotations

import os
from typing import Any

# An embed graph's last output: the token states [B, L, H] (TEI's /embed_all), written by
# factory/onnx.py. Runners name the outputs they fetch (fetched_outputs), so a batch that does
# not ask for token vectors copies none out.
TOKENS_OUTPUT = "tokens"


def fetched_outputs(session: Any) -> list[str]:
    """The outputs an ordinary batch fetches: all of the graph's but the token states."""
    return [o.name for o in session.get_outputs() if o.name != TOKENS_OUTPUT]


def token_width(session: Any) -> int:
    """The width H of the graph's token states; 0 for a graph without them (an artifact built
    before they were exported, or a classifier)."""
    for o in session.get_outputs():
        if o.name == TOKENS_OUTPUT and isinstance(o.shape[-1], int):
            return int(o.shape[-1])
    return 0


def open_session(path: str | os.PathLike[str], threads: int = 1) -> Any:
    """An ONNX Runtime CPU session using `threads` threads and no thread pool of its own beyond
    them (workers are pinned; extra threads would compete for their cores)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: its warnings about unused initializers are noise
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def choose_runtime(requested: str, precision: str, on_gpu: bool, manifest: Any) -> tuple[str, str]:
    """The runtime a worker runs ("torch", "onnx" or "openvino") and a note to log once ("" when
    none).

    `auto` on the CPU is ONNX Runtime whenever the artifact has model.onnx: measured on this
    2-core machine with MiniLM, one thread, sorted SST-2 batches, it ran 2.0-2.3x the texts/s of
    TorchScript (163 against 80; 693 against 306 at batch 16) and 2.8x for texts alone (273
    against 97 a second), with logits within 3e-6. bf16 on the CPU is OpenVINO's (its plain
    graph compiled with the bf16 precision hint: docs/guides/runtimes.md); `--runtime openvino`
    also serves fp32. On CUDA it is TorchScript (the CUDA graphs). Impossible combinations raise
    ValueError with the reason."""
    int8 = precision in ("int8", "int8-checked")
    if on_gpu:
        if requested in ("onnx", "openvino") or int8:
            raise ValueError(
                "--runtime onnx, --runtime openvino and --precision int8 run on the CPU only"
            )
        return "torch", ""
    if precision == "bf16" and requested in ("torch", "onnx"):
        raise ValueError(
            "--precision bf16 on the CPU runs on OpenVINO (measured 2.8-3.7x ONNX Runtime fp32's "
            "texts/s at batch 32): use --runtime openvino or auto"
        )
    if requested == "openvino" and int8:
        raise ValueError(
            f"--precision {precision} runs on ONNX Runtime: use --runtime onnx or auto"
        )
    if precision == "int8-checked" and not manifest.int8_checked:
        raise ValueError(
            "--precision int8-checked needs the second look's threshold, which an artifact "
            "publishes from format 7 on (and only a model with labels): rebuild it with "
            "`ringserve export`, or use int8"
        )
    if requested == "torch":
        if int8:
            raise ValueError(
                f"--precision {precision} runs on ONNX Runtime (measured faster than torch's "
                "int8 with fewer flipped decisions): use --runtime onnx or auto"
            )
        return "torch", ""
    openvino = precision == "bf16" or requested == "openvino"
    wanted = manifest.onnx_file if openvino else manifest.onnx_for(precision)
    if wanted:
        return ("openvino" if openvino else "onnx"), ""
    what = "model.int8.onnx" if int8 else "model.onnx"
    if requested in ("onnx", "openvino") or int8 or precision == "bf16":
        raise ValueError(
            f"the artifact has no {what} (built before ONNX export, or the exporter could not "
            "take the model): rebuild it with `ringserve export`, or use --runtime torch"
            + (" at fp32" if precision == "bf16" else "")
        )
    return "torch", f"the artifact has no {what} (built before ONNX export): serving TorchScript"
