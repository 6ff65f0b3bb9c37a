"""The token-classification peer: what a user would write instead of ringserve, transformers'
`pipeline("token-classification")` behind FastAPI under uvicorn, one text a call, on the same
checkpoint (torch, one thread a process). It answers POST /v1/token-classify {"text": ...} with
the pipeline's entities, so the same load runs against both.

benchmarks/token_classify.py starts it as `uvicorn benchmarks.token_peer:app --workers N`, the
checkpoint's directory in RINGSERVE_PEER_MODEL. Needs the `bench` extra.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import transformers
from fastapi import FastAPI
from pydantic import BaseModel

torch.set_num_threads(1)
SOURCE = os.environ.get("RINGSERVE_PEER_MODEL", "")
PIPE = transformers.pipeline(
    "token-classification",
    model=transformers.AutoModelForTokenClassification.from_pretrained(SOURCE).eval(),
    tokenizer=transformers.AutoTokenizer.from_pretrained(SOURCE),
    aggregation_strategy="simple",
    device=-1,
)
app = FastAPI()


class Text(BaseModel):
    text: str


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/token-classify")
def token_classify(body: Text) -> list[dict[str, Any]]:
    return [
        {"label": e["entity_group"], "score": float(e["score"]), "start": e["start"],
         "end": e["end"], "text": body.text[e["start"] : e["end"]]}
        for e in PIPE(body.text)
    ]  # fmt: skip
