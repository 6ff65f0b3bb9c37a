"""The peer: what a user would run instead of ringserve. A plain FastAPI app under uvicorn, one
text per forward pass, no batching, on the same artifact, runtime and precision as the server
it is compared with (so the difference is the serving, not the model).

It answers POST /v1/classify {"text": ...} like ringserve, so the same load runs against both.
benchmarks/serving.py starts it as `uvicorn benchmarks.peer:app --workers N` with one thread a
process; the runtime comes from RINGSERVE_PEER_RUNTIME and RINGSERVE_PEER_PRECISION.
Needs the `bench` extra: pip install -e '.[bench]'.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import (
    load_manifest,
    load_model,
    load_tokenizer,
)
from ringserve.workers.runtimes.cpu import ACTIVATIONS

app = FastAPI()


class Text(BaseModel):
    text: str


class Model:
    """The model as a user would load it: a tokenizer and one session or module, called once a
    request with arrays made for that request (thread-safe: FastAPI runs handlers in threads)."""

    def __init__(self, runtime: str, precision: str) -> None:
        model_dir = str(default_artifact_dir())
        m = load_manifest(model_dir)
        self.labels = m.labels
        self.activation = ACTIVATIONS[m.activation]
        self.tokenizer = load_tokenizer(model_dir, m.max_length)
        self.session: Any = None
        self.module: Any = None
        if runtime == "onnx":
            from ringserve.workers.runtimes.onnx_model import open_session

            self.session = open_session(f"{model_dir}/{m.onnx_for(precision)}", 1)
        else:
            import torch

            torch.set_num_threads(1)
            self.module = load_model(model_dir)

    def scores(self, text: str) -> np.ndarray:
        ids = np.array([self.tokenizer.encode(text).ids], dtype=np.int64)
        mask = np.ones_like(ids)
        if self.session is not None:
            logits = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        else:
            import torch

            with torch.inference_mode():
                logits = self.module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        return self.activation(np.asarray(logits, dtype=np.float32))[0]


MODEL = Model(
    os.environ.get("RINGSERVE_PEER_RUNTIME", "onnx"),
    os.environ.get("RINGSERVE_PEER_PRECISION", "fp32"),
)


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/classify")
def classify(body: Text) -> dict[str, Any]:
    scores = MODEL.scores(body.text)
    label = int(scores.argmax())
    return {"label": MODEL.labels[label], "label_id": label, "scores": scores.tolist()}
