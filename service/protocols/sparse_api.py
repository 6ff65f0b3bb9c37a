"""A sparse (SPLADE) model's HTTP routes: TEI's `POST /embed_sparse` (a list of
`{"index", "value"}` a text) and ringserve's `POST /v1/embeddings/sparse` (`indices` and
`values` a text, pruned on request by `top_k` and `threshold`, with the terms' token strings on
`return_tokens`). Each text is an ordinary request: its worker answers its nonzero terms only
(workers/process/sparse.py), so texts batch by length with everyone else's."""

from __future__ import annotations

from typing import Any

import orjson
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router, task_route
from ringserve.service.protocols.schemas import decode
from ringserve.service.protocols.schemas import server as bodies
from ringserve.service.protocols.tasks import submit_texts
from ringserve.service.protocols.vocab import tokenizer_for
from ringserve.service.request import prompts
from ringserve.service.request.errors import RequestError, Rule
from ringserve.service.request.lookup import request_model
from ringserve.service.request.sparse_terms import pruned, terms
from ringserve.service.views import FrontView

_NUMPY = orjson.OPT_SERIALIZE_NUMPY  # float32 weights in their shortest form


NOT_SPARSE = Rule("model {model} gives no sparse vectors (a SPLADE model does); its tasks: {tasks}")


def needs_sparse(info: ModelInfo) -> None:
    """400 naming the model's tasks when it gives no sparse vectors."""
    if "sparse" not in info.manifest.task:
        tasks = ", ".join(info.manifest.task)
        raise RequestError(400, NOT_SPARSE.say(model=info.name, tasks=tasks))


def sparse_ask(info: ModelInfo, body: Any, inputs: str | list[str]) -> Ask:
    texts = [inputs] if isinstance(inputs, str) else inputs
    payloads = prompts.with_prompt(info.manifest, body.prompt_name, [t.encode() for t in texts])
    return Ask(payloads, body.options(), "sparse", info.index)


def embed_sparse(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    """TEI's /embed_sparse: for each input, its nonzero terms as `{"index", "value"}`, ids
    ascending; a list of lists, one input or many, as TEI answers."""
    body = decode(ex, bodies.of(server.settings).embed_sparse)
    info = request_model(server, body)
    needs_sparse(info)

    def answer(results: list[Result]) -> bytes:
        out = []
        for r in results:
            ids, values = terms(r)
            out.append(
                [{"index": i, "value": v} for i, v in zip(ids.tolist(), values, strict=True)]
            )
        return orjson.dumps(out, option=_NUMPY)

    submit_texts(server, conn, ex, sparse_ask(info, body, body.inputs), answer)


def sparse_embeddings(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    """/v1/embeddings/sparse: OpenAI's list shape, each text's `indices` and `values`."""
    body = decode(ex, bodies.of(server.settings).sparse_embeddings)
    info = request_model(server, body, vendor=True)
    needs_sparse(info)
    top_k = None if body.top_k is None else int(body.top_k)
    threshold, name = body.threshold, info.name
    vocab = tokenizer_for(info) if body.return_tokens else None

    def answer(results: list[Result]) -> bytes:
        data = []
        for i, r in enumerate(results):
            ids, values = pruned(*terms(r), top_k, threshold)
            item: dict[str, Any] = {
                "object": "sparse_embedding", "index": i, "indices": ids, "values": values,
            }  # fmt: skip
            if vocab is not None:
                item["tokens"] = [vocab.id_to_token(t) or "" for t in ids.tolist()]
            data.append(item)
        used = sum(r.tokens for r in results)
        usage = {"prompt_tokens": used, "total_tokens": used}
        doc = {"object": "list", "data": data, "model": name, "usage": usage}
        return orjson.dumps(doc, option=_NUMPY)

    submit_texts(server, conn, ex, sparse_ask(info, body, body.input), answer)


# What a body the schema allows can still be refused for (the document lists each: ROUTES)
RULES = (NOT_SPARSE, prompts.UNKNOWN)
ROUTES = [
    task_route(
        "/embed_sparse", embed_sparse, "Sparse vectors (SPLADE), in TEI's shape", "sparse",
        ("a list a text of its nonzero terms, ids ascending", "embed_sparse", "embed_sparse"),
        {"inputs": ["a fine film"]}, RULES,
    ),
    task_route(
        "/v1/embeddings/sparse", sparse_embeddings,
        "Sparse vectors (SPLADE): indices and values a text, pruned on request", "sparse",
        ("each text's nonzero terms, ids ascending", "sparse_embeddings", "sparse_embeddings"),
        {"input": "a fine film", "top_k": 64, "return_tokens": True}, RULES,
    ),
]  # fmt: skip


def sparse_routes(router: Router) -> None:
    router.mount(ROUTES)
