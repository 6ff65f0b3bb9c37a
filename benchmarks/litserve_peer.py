"""The batching peer: LitServe with its own dynamic batching, what a user picks instead of
ringserve when they want batches without writing a server. 2 inference workers of 1 thread each,
the artifact's model.onnx on ONNX Runtime and its tokenizer, answering POST /v1/classify
{"text": ...} as ringserve does, so the same load runs against both.

    python -m benchmarks.litserve_peer --port P [--workers 2] [--max-batch 32]

Needs the `bench` extra (litserve). benchmarks/serving.py starts and stops it. No `from
__future__ import annotations` here: LitServe reads decode_request's annotation as a class.
"""

import argparse
import os
import sys
from typing import Any

import litserve as ls
import numpy as np
from pydantic import BaseModel
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import load_manifest, load_tokenizer
from ringserve.workers.runtimes.cpu import ACTIVATIONS


class Text(BaseModel):
    text: str


class Classifier(ls.LitAPI):  # type: ignore[misc]
    def setup(self, device: str) -> None:
        from ringserve.workers.runtimes.onnx_model import open_session

        model_dir = default_artifact_dir()
        m = load_manifest(model_dir)
        self.labels = m.labels
        self.activation = ACTIVATIONS[m.activation]
        self.tokenizer = load_tokenizer(model_dir, m.max_length)
        self.session = open_session(model_dir / m.onnx_file, 1)

    def decode_request(self, request: Text) -> str:
        return request.text

    def batch(self, texts: list[str]) -> list[str]:
        return texts

    def predict(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        length = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), length), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = 1
        logits = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        return self.activation(np.asarray(logits, dtype=np.float32))

    def unbatch(self, scores: np.ndarray) -> list[np.ndarray]:
        return list(scores)

    def encode_response(self, scores: np.ndarray) -> dict[str, Any]:
        label = int(scores.argmax())
        return {"label": self.labels[label], "label_id": label, "scores": scores.tolist()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--batch-timeout-ms", type=float, default=5.0)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    api = Classifier(
        max_batch_size=args.max_batch,
        batch_timeout=args.batch_timeout_ms / 1000,
        api_path="/v1/classify",
    )
    server = ls.LitServer(
        api,
        accelerator="cpu",
        devices=1,
        workers_per_device=args.workers,
        timeout=60,
    )
    server.run(host="127.0.0.1", port=args.port, log_level="warning", generate_client_file=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
