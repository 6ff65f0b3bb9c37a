"""LitServe serving all-MiniLM-L6-v2's embeddings as its users would: a LitAPI that loads the
sentence-transformers directory with torch and encodes each batch LitServe's own batching
gathers (up to --max-batch texts or --batch-timeout-ms), one worker, torch's threads on every
core. POST /predict {"input": TEXT} answers {"embedding": [...]}.

    .venv-litserve/bin/python benchmarks/peers/litserve_embed.py --port P --model DIR
        [--dtype float32|bfloat16]

Run by benchmarks/peers.py from its own venv (`benchmarks/peers/install_peer.sh litserve`);
imports nothing of ringserve. No `from __future__ import annotations`: LitServe reads the
annotations of decode_request.
"""

import argparse
import sys
from typing import Any

import litserve as ls
import torch
from sentence_transformers import SentenceTransformer


class Embedder(ls.LitAPI):
    def __init__(self, model_dir: str, dtype: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_dir, self.dtype = model_dir, getattr(torch, dtype)

    def setup(self, device: str) -> None:
        self.model = SentenceTransformer(self.model_dir, device=device)
        self.model.to(self.dtype)  # bfloat16: oneDNN's bf16 kernels where the CPU has them

    def decode_request(self, request: dict) -> str:
        return request["input"]

    def predict(self, texts: list[str]) -> list[list[float]]:
        with torch.inference_mode():
            vectors = self.model.encode(texts, batch_size=len(texts), convert_to_tensor=True)
        return vectors.float().tolist()

    def encode_response(self, vector: list[float]) -> dict:
        return {"embedding": vector}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True, help="the sentence-transformers directory")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--batch-timeout-ms", type=float, default=5.0)
    args = p.parse_args()
    api = Embedder(args.model, args.dtype, max_batch_size=args.max_batch,
                   batch_timeout=args.batch_timeout_ms / 1000)  # fmt: skip
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=60)
    server.run(host="127.0.0.1", port=args.port, log_level="warning", generate_client_file=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
