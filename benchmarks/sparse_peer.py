"""The sparse peer: what a user would write instead of ringserve for a SPLADE model. A plain
FastAPI app under uvicorn around sentence-transformers' `SparseEncoder`, one request a call of
`encode`, answering TEI's `POST /embed_sparse` ({"inputs": ...} -> [[{"index", "value"}, ...]])
so that the same load runs against both. The model directory comes from RINGSERVE_SPARSE_PEER_DIR
(a SparseEncoder directory, or a masked-language model given SpladePooling here); torch's
threads from RINGSERVE_SPARSE_PEER_THREADS (default: torch's own, every core).
Needs the `bench` and `test` extras (FastAPI, sentence-transformers)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI
from pydantic import BaseModel

from devkit.sparse_models import reference

app = FastAPI()
if os.environ.get("RINGSERVE_SPARSE_PEER_THREADS"):
    torch.set_num_threads(int(os.environ["RINGSERVE_SPARSE_PEER_THREADS"]))
MODEL = reference(
    Path(os.environ["RINGSERVE_SPARSE_PEER_DIR"]),
    max_length=int(os.environ.get("RINGSERVE_SPARSE_PEER_MAX_LENGTH", "256")),
)


class Inputs(BaseModel):
    inputs: str | list[str]


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/embed_sparse")
def embed_sparse(body: Inputs) -> list[list[dict[str, Any]]]:
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    with torch.inference_mode():
        rows = MODEL.encode(texts, convert_to_tensor=True).coalesce()
    ids, values = rows.indices(), rows.values()
    out: list[list[dict[str, Any]]] = [[] for _ in texts]
    for row, term, value in zip(ids[0].tolist(), ids[1].tolist(), values.tolist(), strict=True):
        out[row].append({"index": term, "value": value})
    return out
