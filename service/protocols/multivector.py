"""Multivector (ColBERT) models in the front-end: POST /v1/embeddings/multi, and the MaxSim
score the rerank routes (TEI's /rerank, Cohere's /v1/rerank and /v2/rerank, KServe's infer
over HTTP and gRPC) give such a model.

Every text is an ordinary request to the dispatcher asking for its token vectors
(shm/layout.py OPT_TOKENS; a query's with OPT_QUERY), so queries and documents batch by length
with everyone else's texts and are re-sent when a worker dies. The worker tokenizes them as
PyLate does and answers the normalized projected vectors of the tokens kept
(workers/process/multivector.py). MaxSim is computed here, once the texts are in: for each
query token the largest dot product with the document's tokens, summed over the query's
tokens: one matrix product over all the documents of a request.
"""

from __future__ import annotations

import json

import numpy as np
import orjson
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols import admit
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router, task_route
from ringserve.service.protocols.schemas import Truncation, decode
from ringserve.service.protocols.schemas import server as bodies
from ringserve.service.request.lookup import needs_task, request_model
from ringserve.service.request.maxsim import matrix, maxsim
from ringserve.service.views import FrontView
from ringserve.shm import layout as L

TASK = "multivector"
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def is_multivector(info: ModelInfo) -> bool:
    return bool(info.manifest.multivector)


def rerank_ask(info: ModelInfo, body: Truncation, query: str, docs: list[str]) -> Ask:
    """The query's token vectors, then each document's: one group, one answer."""
    opts = body.options() | L.OPT_TOKENS
    payloads = [query.encode(), *[d.encode() for d in docs]]
    options = [opts | L.OPT_QUERY] + [opts] * len(docs)
    return Ask(payloads, options, "rerank", info.index)


def rerank_scores(results: list[Result]) -> np.ndarray:
    """Each document's MaxSim with the query, from a rerank_ask group's answers."""
    return maxsim(matrix(results[0]), [matrix(r) for r in results[1:]])


def token_json(vectors: np.ndarray) -> bytes:
    return orjson.dumps(np.ascontiguousarray(vectors, dtype=np.float32), option=_NUMPY)


def multi_embeddings(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    """POST /v1/embeddings/multi: each text's token vectors, as a query or a document."""
    body = decode(ex, bodies.of(server.settings).multi_embeddings)
    info = request_model(server, body)
    needs_task(info, TASK)
    inputs = [body.input] if isinstance(body.input, str) else body.input
    opts = body.options() | L.OPT_TOKENS | (L.OPT_QUERY if body.input_type == "query" else 0)
    ask = Ask([t.encode() for t in inputs], opts, "embed", info.index)
    name = json.dumps(info.name).encode()

    def done(results: list[Result]) -> None:
        data = b",".join(
            b'{"index":%d,"embedding":%s}' % (i, token_json(matrix(r)))
            for i, r in enumerate(results)
        )
        tokens = sum(r.tokens for r in results)
        usage = b'{"prompt_tokens":%d,"total_tokens":%d}' % (tokens, tokens)
        answer = b'{"object":"list","data":[%s],"model":%s,"usage":%s}' % (data, name, usage)
        conn.respond(ex, 200, answer, extra=[latency_header(conn, ex)])

    admit.submit(server.admission, conn, ex, ask, done)


ROUTES = [
    task_route(
        "/v1/embeddings/multi", multi_embeddings,
        "Token vectors of a multivector (ColBERT) model, one matrix a text", "multivector",
        ("one matrix a text", "multi_embeddings", "multi_embeddings"),
        {"input": ["a fine film"], "input_type": "document"},
    ),
]  # fmt: skip


def routes(router: Router) -> None:
    router.mount(ROUTES)
