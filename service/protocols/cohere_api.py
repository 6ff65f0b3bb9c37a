"""Cohere's v2 API, as the `cohere` SDK's ClientV2 sends it: POST /v2/rerank and /v2/embed
(v1's /v1/rerank is in tasks.py). Answers carry Cohere's `id` and `meta`; errors Cohere's
`message` (service/protocols/errors.py)."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import numpy as np
from ringserve.service.engine.dispatcher import Result
from ringserve.service.model_info import ModelInfo
from ringserve.service.protocols import tasks
from ringserve.service.protocols.http import Exchange, HttpError, HttpProtocol
from ringserve.service.protocols.routes import (
    Router,
    inference,
    needs_task,
    request_model,
)
from ringserve.service.views import FrontView
from ringserve.shm import layout as L

INPUT_TYPES = ("search_document", "search_query", "classification", "clustering")
# The sentence-transformers prompt names each input_type is looked up under, in order.
PROMPT_NAMES = {
    "search_document": ("document", "passage", "search_document"),
    "search_query": ("query", "search_query"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
EMBEDDING_TYPES = ("float", "base64")
# Cohere's truncate: NONE refuses a long text, START drops its start, END its end.
TRUNCATE = {"NONE": L.OPT_REFUSE, "START": L.OPT_CUT | L.OPT_LEFT, "END": L.OPT_CUT}


def meta(billed: dict[str, int]) -> dict[str, Any]:
    return {"api_version": {"version": "2"}, "billed_units": billed}


def prompt_for(info: ModelInfo, input_type: str | None) -> str:
    """The model's prompt for Cohere's input_type, when its artifact keeps prompts
    (sentence-transformers' `prompts`) and one fits; else none (the type is taken as given)."""
    prompts = getattr(info.manifest, "prompts", None) or info.manifest.extra.get("prompts") or {}
    if input_type is None or not isinstance(prompts, dict):
        return ""
    for name in PROMPT_NAMES.get(input_type, ()):
        if isinstance(prompts.get(name), str):
            return str(prompts[name])
    return ""


def options_byte(doc: dict[str, Any], embed: bool) -> int:
    """The texts' options byte (shm/layout.py OPT_*) for Cohere's `truncate` (END by default)."""
    truncate = "END" if doc.get("truncate") is None else doc["truncate"]
    if not isinstance(truncate, str) or truncate not in TRUNCATE:
        raise HttpError(400, 'truncate must be "NONE", "START" or "END"')
    return TRUNCATE[truncate] | (L.OPT_EMBED if embed else 0)


def embedding_types(doc: dict[str, Any]) -> list[str]:
    kinds = doc.get("embedding_types")
    if kinds is None:
        return ["float"]
    if not isinstance(kinds, list) or not kinds or any(k not in EMBEDDING_TYPES for k in kinds):
        raise HttpError(400, 'embedding_types may hold "float" and "base64"')
    return list(dict.fromkeys(kinds))


def cohere_embed(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    doc = tasks.json_object(ex)
    info = request_model(server, doc, vendor=True)
    needs_task(info, "embed")
    if doc.get("images") is not None or doc.get("inputs") is not None:
        raise HttpError(400, 'only "texts" are embedded here (no images or mixed inputs)')
    if doc.get("max_tokens") is not None:
        raise HttpError(400, "max_tokens is not taken: the model's max_length and truncate apply")
    input_type = doc.get("input_type")
    if input_type is not None and input_type not in INPUT_TYPES:
        raise HttpError(400, f"input_type must be one of {', '.join(INPUT_TYPES)}")
    texts = tasks.text_list(doc.get("texts"), "texts", server.settings.max_texts, one_ok=False)
    kinds = embedding_types(doc)
    keep = tasks.dimensions(doc, info.manifest.dimension, "output_dimension")
    prompt = prompt_for(info, input_type).encode()
    payloads = tasks.Texts([prompt + t for t in texts], options_byte(doc, embed=True))
    originals = [t.decode() for t in texts]

    def answer(results: list[Result]) -> dict[str, Any]:
        vecs = tasks.vectors(results, info.manifest.normalize or bool(keep), keep)
        out: dict[str, Any] = {}
        if "float" in kinds:
            out["float"] = np.asarray(vecs, dtype=np.float64).tolist()
        if "base64" in kinds:
            out["base64"] = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vecs]
        return {
            "id": str(uuid.uuid4()),
            "response_type": "embeddings_by_type",
            "embeddings": out,
            "texts": originals,
            "meta": meta({"input_tokens": sum(r.tokens for r in results)}),
        }

    tasks.submit_texts(server, conn, ex, payloads, answer, "embed", info)


def cohere_rerank_v2(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    doc = tasks.json_object(ex)
    info = request_model(server, doc, vendor=True)
    needs_task(info, "rerank")
    if doc.get("max_tokens_per_doc") is not None:
        raise HttpError(400, "max_tokens_per_doc is not taken: the model's max_length applies")
    docs = tasks.documents(doc, "documents", server.settings.max_documents)
    payloads = tasks.rerank_pairs(info, doc, docs, "documents")
    top = tasks.top_n(doc, len(docs))

    def answer(results: list[Result]) -> dict[str, Any]:
        hits = [{"index": i, "relevance_score": s} for i, s in tasks.ranked(results, top)]
        return {"id": str(uuid.uuid4()), "results": hits, "meta": meta({"search_units": 1})}

    tasks.submit_texts(server, conn, ex, payloads, answer, "rerank", info)


def cohere_routes(router: Router) -> None:
    s = router.server
    router.add("POST", "/v2/embed", inference(s, cohere_embed))
    router.add("POST", "/v2/rerank", inference(s, cohere_rerank_v2))
