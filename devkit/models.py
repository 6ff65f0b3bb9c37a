"""Models for tests and benchmarks: the model alone on a runner, and an artifact as an older
format wrote it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ringserve.workers.artifact import compute_fingerprint


def raw_runner(
    model_dir: str, runtime: str, precision: str, max_batch: int, graph: str = "plain"
) -> Any:
    """The model alone on one thread, run as a CPU worker runs it (workers/process/): an
    OrtRunner on the artifact's ONNX file for `precision`, an OvRunner (runtime "openvino": the
    plain graph compiled at `precision`), or TorchScript without the profiling executor. For the
    benchmarks' ceilings; imports torch, so call it in the measuring process."""
    import torch
    from ringserve.workers.artifact import load_manifest, load_model
    from ringserve.workers.process.served import set_graph_optimize
    from ringserve.workers.runtimes.cpu import CpuRunner, OrtRunner
    from ringserve.workers.runtimes.onnx_model import open_session

    torch.set_num_threads(1)
    m = load_manifest(model_dir)
    if precision == "int8-checked":  # its int8 graph and the plain fp32 one, as a worker's
        from ringserve.workers.runtimes.checked import CheckedRunner

        int8 = open_session(f"{model_dir}/{m.onnx_for(precision)}")
        fp32 = open_session(f"{model_dir}/{m.onnx_file}")
        threshold = float(m.int8_checked["threshold"])
        return CheckedRunner(
            int8, fp32, threshold, len(m.labels), m.activation, m.max_length, max_batch
        )
    if runtime == "onnx":
        session = open_session(f"{model_dir}/{m.onnx_for(precision, graph)}")
        return OrtRunner(session, m.max_length, max_batch, precision=precision)
    if runtime == "openvino":
        from ringserve.workers.runtimes.openvino import OvRunner, compile_model

        compiled = compile_model(f"{model_dir}/{m.onnx_file}", precision, 1)
        return OvRunner(compiled, m.max_length, max_batch, precision=precision)
    set_graph_optimize(True)
    return CpuRunner(load_model(model_dir), m.max_length, max_batch)


def old_artifact(default_model: str, tmp_path: Path) -> Path:
    """The default artifact as format 1 wrote it: TorchScript, tokenizer and manifest only."""
    old = tmp_path / "old"
    old.mkdir()
    for name in ("model.pt", "tokenizer.json"):
        shutil.copyfile(Path(default_model) / name, old / name)
    raw = json.loads((Path(default_model) / "manifest.json").read_text())
    for key in ("onnx_file", "int8_file", "int8", "fused_file", "data_files", "graphs"):
        del raw[key]
    for key in ("checked_file", "int8_checked", "bf16"):  # formats 6 and later, when built
        raw.pop(key, None)
    (old / "manifest.json").write_text(json.dumps(raw))
    raw["fingerprint"] = compute_fingerprint(old)
    (old / "manifest.json").write_text(json.dumps(raw))
    return old
