"""Cohere's v2 API, as the `cohere` SDK's ClientV2 sends it: POST /v2/rerank and /v2/embed
(v1's /v1/rerank is in tasks.py). Answers carry Cohere's `id` and `meta`; errors Cohere's
`message` (service/protocols/errors.py)."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import msgspec
import numpy as np
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols import cached, compact, tasks
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router, task_route
from ringserve.service.protocols.schemas import decode
from ringserve.service.protocols.schemas import server as bodies
from ringserve.service.protocols.schemas.cohere import CohereEmbeddings, EmbeddingsByType
from ringserve.service.protocols.schemas.tasks import CohereHitV2, CohereRankingV2
from ringserve.service.request.lookup import needs_task, request_model
from ringserve.service.request.vectors import vectors
from ringserve.service.views import FrontView
from ringserve.shm import layout as L

# The sentence-transformers prompt names each input_type (schemas/cohere.py) is looked up under.
PROMPT_NAMES = {
    "search_document": ("document", "passage", "search_document"),
    "search_query": ("query", "search_query"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
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


def cohere_embed(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    body = decode(ex, bodies.of(server.settings).cohere_embed)
    info = request_model(server, body, vendor=True)
    needs_task(info, "embed")
    kinds = list(dict.fromkeys(body.embedding_types or ["float"]))
    keep = 0
    if body.output_dimension is not None:
        keep = tasks.within_dimension(body.output_dimension, info, "output_dimension")
    ranges = compact.check(info, kinds, bool(keep))
    prompt = prompt_for(info, body.input_type).encode()
    options = TRUNCATE[body.truncate or "END"] | L.OPT_EMBED
    payloads = Ask([prompt + t.encode() for t in body.texts], options, "embed", info.index)
    originals = body.texts

    def answer(results: list[Result]) -> bytes:
        vecs = vectors(results, info.manifest.normalize or bool(keep), keep)
        out = EmbeddingsByType()
        if "float" in kinds:
            out.floats = np.asarray(vecs, dtype=np.float64).tolist()
        if "base64" in kinds:
            out.base64 = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vecs]
        for kind in kinds:
            if kind in compact.COMPACT:
                setattr(out, kind, compact.as_lists(vecs, kind, ranges))
        tokens = sum(r.tokens for r in results)
        answer = CohereEmbeddings(
            str(uuid.uuid4()), "embeddings_by_type", out, originals, meta({"input_tokens": tokens})
        )
        return msgspec.json.encode(answer)

    cached.submit_embed(server, info, conn, ex, payloads, answer)


def cohere_rerank_v2(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    body = decode(ex, bodies.of(server.settings).cohere_rerank_v2)
    info = request_model(server, body, vendor=True)
    needs_task(info, "rerank")
    docs = tasks.document_texts(body.documents)
    payloads = tasks.rerank_pairs(info, body, docs)
    top = tasks.top_of(body, len(docs))

    def answer(results: list[Result]) -> bytes:
        hits = [CohereHitV2(i, s) for i, s in tasks.ranked(results, top)]
        ranking = CohereRankingV2(str(uuid.uuid4()), hits, meta({"search_units": 1}))
        return msgspec.json.encode(ranking)

    tasks.submit_texts(server, conn, ex, payloads, answer)


ROUTES = [
    task_route(
        "/v2/embed", cohere_embed, "Embeddings, in Cohere's v2 shape", "embed",
        ("by type", "cohere_embed", "cohere_embed"),
        {"texts": ["a fine film"], "input_type": "search_document"},
        (tasks.DIMENSIONS.only(key="output_dimension"), *tasks.COMPACT_RULES),
    ),
    task_route(
        "/v2/rerank", cohere_rerank_v2, "Rerank documents, in Cohere's v2 shape", "rerank",
        ("highest score first", "cohere_rerank_v2", "cohere_rerank_v2"),
        {"query": "films", "documents": ["a film", "a cat"]},
    ),
]  # fmt: skip


def cohere_routes(router: Router) -> None:
    router.mount(ROUTES)
