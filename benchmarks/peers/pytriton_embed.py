"""PyTriton serving all-MiniLM-L6-v2's embeddings as its users would: a torch inference callable
(sentence-transformers' encode) under @batch, bound to Triton with its dynamic batcher (up to
--max-batch texts, --queue-delay-us), over Triton's HTTP endpoint (KServe v2 JSON):
POST /v2/models/minilm/infer with a BYTES input `text` of shape [1, 1] answers an FP32 output
`embedding` of shape [1, 384]. Triton's gRPC and metrics endpoints are on their own free ports.

    .venv-pytriton/bin/python benchmarks/peers/pytriton_embed.py --port P --grpc-port G
        --metrics-port M --model DIR [--dtype float32|bfloat16]

Run by benchmarks/peers.py from its own venv (`benchmarks/peers/install_peer.sh pytriton`);
imports nothing of ringserve.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from sentence_transformers import SentenceTransformer

NAME = "minilm"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--model", required=True, help="the sentence-transformers directory")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--queue-delay-us", type=int, default=5000)
    args = p.parse_args()
    # Triton's Python stub links libpython3.X.so by name: the first one the loader finds (a
    # system 3.11.2 beside a pyenv 3.11.7) must be this interpreter's, or its C modules and this
    # stdlib disagree (multiprocessing fails at the model's start). Triton inherits the variable.
    libdir = sysconfig.get_config_var("LIBDIR")
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p
    )
    model = SentenceTransformer(args.model, device="cpu")
    model.to(getattr(torch, args.dtype))  # bfloat16: oneDNN's bf16 kernels where the CPU has them

    @batch
    def infer(text: np.ndarray) -> dict[str, np.ndarray]:
        texts = [row[0].decode() for row in text]
        with torch.inference_mode():
            vectors = model.encode(texts, batch_size=len(texts), convert_to_tensor=True)
        return {"embedding": vectors.float().numpy()}

    config = TritonConfig(http_address="127.0.0.1", http_port=args.port,
                          grpc_address="127.0.0.1", grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port)  # fmt: skip
    with Triton(config=config) as triton:
        triton.bind(
            model_name=NAME,
            infer_func=infer,
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="embedding", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.queue_delay_us),
            ),
        )
        triton.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
