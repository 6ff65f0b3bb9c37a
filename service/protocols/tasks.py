"""HTTP routes of the embed and rerank tasks, in the shapes RAG tools call: OpenAI's
/v1/embeddings, TEI's /embed and /rerank, Cohere's /v1/rerank.

Every text is an ordinary request to the dispatcher: an embedding asks its worker for the
vector (shm/layout.py OPT_EMBED), a rerank document is a (query, document) pair, so they batch
by length with everyone else's texts and are re-sent when a worker dies.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import orjson
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols import (
    admit,
    compact,
    late_chunking,
    multivector,
    vocab,
)
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.cached import Written, submit_embed
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router, task_route
from ringserve.service.protocols.schemas import UNSET, Truncation, decode
from ringserve.service.protocols.schemas import server as bodies
from ringserve.service.protocols.schemas.tasks import (
    CohereHit,
    CohereRanking,
    Document,
    DocumentText,
    Rerank,
    TeiHit,
)
from ringserve.service.protocols.vocab import text_of_ids
from ringserve.service.request import prompts
from ringserve.service.request.errors import RequestError, Rule
from ringserve.service.request.lookup import needs_task, request_model
from ringserve.service.request.vectors import vectors
from ringserve.service.views import FrontView
from ringserve.shm import layout as L


def ask(body: Truncation, texts: list[bytes], task: str, info: ModelInfo) -> Ask:
    """A task route's core request: the texts with the body's long-text options (`truncate`
    and friends) in every record, and OPT_EMBED when they are to be embedded."""
    options = body.options() | (L.OPT_EMBED if task == "embed" else 0)
    return Ask(texts, options, task, info.index)


def submit_texts(
    server: FrontView,
    conn: HttpProtocol,
    ex: Exchange,
    ask: Ask,
    answer: Callable[[list[Result]], Any],
) -> None:
    def done(results: list[Result]) -> None:
        reply(conn, ex, answer(results))

    admit.submit(server.admission, conn, ex, ask, done)


def reply(conn: HttpProtocol, ex: Exchange, doc: Any) -> None:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    conn.respond(ex, 200, body, extra=[latency_header(conn, ex)])


# -- embeddings ----------------------------------------------------------------------------------


def float_json(vecs: np.ndarray) -> bytes:
    """Float32 vectors (or one) as JSON arrays, each float in the shortest form that reads back
    as the same float32, in one C call (orjson). Measured on one 384-float vector: 6.7 us and
    4.2 KB, against 58 us and 5.3 KB for one "%.9g" format call over tolist() and 173 us for
    json.dumps (17 digits a float64); the answer's formatting was what kept embeddings/s below
    classify/s at c=64 on this 2-core machine (benchmarks/embed.py), the front-end sharing the
    cores with the workers."""
    return orjson.dumps(np.ascontiguousarray(vecs, dtype=np.float32), option=_NUMPY)


_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def openai_embeddings(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    body = decode(ex, bodies.of(server.settings).openai_embeddings)
    info = request_model(server, body, vendor=True)  # OpenAI's "model"
    needs_task(info, "embed")
    if body.late_chunking:
        chunks = late_chunking.chunks_of(body.input)
        texts = openai_inputs(chunks, info, server.settings.max_texts)
    else:
        texts = openai_inputs(body.input, info, server.settings.max_texts)
        texts = prompts.with_prompt(info.manifest, body.prompt_name, texts)
    fmt = body.encoding_format
    keep = 0 if body.dimensions is None else within_dimension(body.dimensions, info)
    ranges = compact.check(info, [fmt], bool(keep))
    # A cut vector is renormalized (OpenAI's `dimensions`); a whole one as the model does.
    written = openai_written(info.name, fmt, ranges, info.manifest.normalize or bool(keep), keep)
    if body.late_chunking:
        late(server, info, conn, ex, [t.decode() for t in texts], body.prompt_name, written)
    else:
        submit_embed(server, info, conn, ex, ask(body, texts, "embed", info), written)


def openai_written(
    name: str, fmt: str, ranges: np.ndarray | None, normalize: bool, keep: int
) -> Written:
    """OpenAI's answer: a row an embedding object's vector, in `fmt`, then the list around."""

    def rows(results: list[Result]) -> list[bytes]:
        return encoded(vectors(results, normalize, keep), fmt, ranges)

    model = json.dumps(name).encode()

    def whole(rows: list[bytes], tokens: int) -> bytes:
        data = b",".join(
            b'{"object":"embedding","index":%d,"embedding":%s}' % (i, v) for i, v in enumerate(rows)
        )
        return b'{"object":"list","data":[%s],"model":%s,"usage":%s}' % (data, model, usage(tokens))

    return Written(("openai", fmt, normalize, keep), rows, whole)


def usage(tokens: int) -> bytes:
    """OpenAI's `usage` as json.dumps wrote it before the rows were kept (a space after each
    separator), so that an answer's bytes did not change with the cache."""
    return b'{"prompt_tokens": %d, "total_tokens": %d}' % (tokens, tokens)


def late(
    server: FrontView,
    info: ModelInfo,
    conn: HttpProtocol,
    ex: Exchange,
    chunks: list[str],
    prompt_name: str | None,
    answer: Callable[[list[Result]], Any],
) -> None:
    """Late chunking (late_chunking.py): the chunks as one document, a vector a chunk."""
    prompt = prompts.prompt_bytes(info.manifest, prompt_name).decode()
    plan = late_chunking.Plan(info, chunks, prompt, server.settings.max_windows)
    submit_texts(server, conn, ex, plan.ask(info.index), late_chunking.answered(plan, answer))


# What a body the schema allows can still be refused for (the document lists each: ROUTES).
DIMENSIONS = Rule("{key} must be an integer from 1 to the model's {dimension}")
INPUT_COUNT = Rule("input must hold 1 to {limit} items, not {n}")  # a batch: ids are one text
INPUT_MIXED = Rule("input mixes texts, token ids and lists of token ids")
# vocab.text_of_ids: ids the model's tokenizer refuses; texts.require: an empty list of ids
TOKEN_ID_RULES = (
    vocab.OUTSIDE,
    vocab.UNFRAMED,
    vocab.RETOKENIZED,
    Rule(regex=r"^input(\[\d+\])? is empty$"),
)
# compact.check: int8/uint8 without their calibration's vectors
COMPACT_RULES = (compact.NO_CALIBRATION, compact.WHOLE_VECTORS, compact.OWN_VECTORS)
# late_chunking.py: a model without token states, a chunk without a token
LATE_RULES = (
    late_chunking.TEXTS_ONLY,
    late_chunking.NO_STATES,
    late_chunking.DENSE,
    late_chunking.POOLING,
    late_chunking.NO_TOKENS,
    late_chunking.UNWINDOWED,
)
EMBED_RULES = (prompts.UNKNOWN, *COMPACT_RULES, *LATE_RULES)  # /embed, and TEI's embed routes


def within_dimension(keep: float, info: ModelInfo, key: str = "dimensions") -> int:
    """OpenAI's `dimensions` (Cohere's `output_dimension`), a positive integer by its schema:
    at most the model's own dimension."""
    dimension = info.manifest.dimension
    if keep > dimension:
        raise RequestError(400, DIMENSIONS.say(key=key, dimension=dimension))
    return int(keep)


def openai_inputs(value: str | list[Any], info: ModelInfo, limit: int) -> list[bytes]:
    """OpenAI's `input`, decoded: a text, a list of texts, of token ids, or of lists of token
    ids, as UTF-8 texts (ids spelled out by the model's tokenizer: service/protocols/vocab)."""
    if isinstance(value, str):
        return [value.encode()]
    if all(isinstance(v, float) for v in value):
        return [text_of_ids(info, [int(v) for v in value], "input")]
    if len(value) > limit:
        raise RequestError(400, INPUT_COUNT.say(limit=limit, n=len(value)))
    if all(isinstance(v, str) for v in value):
        return [v.encode() for v in value]
    if all(isinstance(v, list) for v in value):
        return [
            text_of_ids(info, [int(t) for t in ids], f"input[{i}]") for i, ids in enumerate(value)
        ]
    raise RequestError(400, INPUT_MIXED.say())


def encoded(vecs: np.ndarray, fmt: str, ranges: np.ndarray | None) -> list[bytes]:
    """Each embedding as JSON: an array of floats, OpenAI's base64 string of the little-endian
    float32 bytes, or a compact vector's integers (compact.py), cut in one pass."""
    if fmt == "base64":
        return [b'"' + base64.b64encode(v.astype("<f4").tobytes()) + b'"' for v in vecs]
    if fmt in compact.COMPACT:
        return [orjson.dumps(v, option=_NUMPY) for v in compact.quantize(vecs, fmt, ranges)]
    return [float_json(v) for v in vecs]


def tei_embed(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    body = decode(ex, bodies.of(server.settings).tei_embed)
    info = request_model(server, body)
    needs_task(info, "embed")
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if body.late_chunking:
        texts = [t.encode() for t in inputs]
    else:
        texts = prompts.with_prompt(info.manifest, body.prompt_name, [t.encode() for t in inputs])
    normalize, fmt = body.normalize, body.encoding_format
    ranges = compact.check(info, [fmt], False, normalize)
    written = tei_written(fmt, ranges, normalize)
    if body.late_chunking:
        late(server, info, conn, ex, inputs, body.prompt_name, written)
    else:
        submit_embed(server, info, conn, ex, ask(body, texts, "embed", info), written)


def tei_written(fmt: str, ranges: np.ndarray | None, normalize: bool) -> Written:
    """TEI's answer: the [N, D] matrix, a row a text."""

    def rows(results: list[Result]) -> list[bytes]:
        vecs = vectors(results, normalize)
        if fmt in compact.COMPACT:
            return [orjson.dumps(v, option=_NUMPY) for v in compact.quantize(vecs, fmt, ranges)]
        return [float_json(v) for v in vecs]

    return Written(("tei", fmt, normalize), rows, lambda rows, _: b"[%s]" % b",".join(rows))


# -- rerank --------------------------------------------------------------------------------------
def ranked(results: list[Result], top: int, raw: bool = False) -> list[tuple[int, float]]:
    """(document index, score) highest first, ties in input order, cut at `top`. The score is
    the cross-encoder's sigmoid probability, or with `raw` its logit; a multivector model's
    (its answers are token vectors: the query's, then each document's) MaxSim, raw or not."""
    if results and results[0].flags & L.RSP_TOKENS:
        probs = multivector.rerank_scores(results)
        raw = False
    else:
        probs = np.array([float(r.scores[0]) for r in results], dtype=np.float64)  # type: ignore[index]
    if raw:
        p = np.clip(probs, 1e-45, 1 - 1e-7)
        probs = np.log(p) - np.log1p(-p)
    order = sorted(range(len(probs)), key=lambda i: -probs[i])[:top]
    return [(i, float(probs[i])) for i in order]


def rerank_pairs(info: ModelInfo, body: Rerank, docs: list[str]) -> Ask:
    """Each document after the query, one pair a worker payload; for a multivector model, the
    query, then each document (multivector.rerank_ask)."""
    needs_task(info, "rerank")
    if multivector.is_multivector(info):
        return multivector.rerank_ask(info, body, body.query, docs)
    query = body.query.encode() + L.PAIR_SEPARATOR
    return ask(body, [query + d.encode() for d in docs], "rerank", info)


def document_texts(docs: list[str | Document]) -> list[str]:
    """The documents as strings; Cohere's may also be objects with a `text`."""
    return [d if isinstance(d, str) else d.text for d in docs]


def top_of(body: Rerank, n: int) -> int:
    return n if body.top_n is None else min(int(body.top_n), n)


def tei_rerank(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    body = decode(ex, bodies.of(server.settings).tei_rerank)
    info = request_model(server, body)
    docs = document_texts(body.texts)
    payloads = rerank_pairs(info, body, docs)
    top, raw, with_text = top_of(body, len(docs)), body.raw_scores, body.return_text

    def answer(results: list[Result]) -> bytes:
        hits = [
            TeiHit(i, score, docs[i] if with_text else UNSET)
            for i, score in ranked(results, top, raw)
        ]
        return msgspec.json.encode(hits)

    submit_texts(server, conn, ex, payloads, answer)


def cohere_rerank(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    body = decode(ex, bodies.of(server.settings).cohere_rerank)
    info = request_model(server, body, vendor=True)  # Cohere's "model"
    docs = document_texts(body.documents)
    payloads = rerank_pairs(info, body, docs)
    top, with_docs = top_of(body, len(docs)), body.return_documents

    def answer(results: list[Result]) -> bytes:
        hits = [
            CohereHit(i, score, DocumentText(docs[i]) if with_docs else UNSET)
            for i, score in ranked(results, top)
        ]
        return msgspec.json.encode(CohereRanking(hits))

    submit_texts(server, conn, ex, payloads, answer)


ROUTES = [
    task_route(
        "/v1/embeddings", openai_embeddings, "Embeddings, in OpenAI's shape", "embed",
        ("the vectors", "openai_embeddings", "openai_embeddings"), {"input": "a fine film"},
        (prompts.UNKNOWN, DIMENSIONS.only(key="dimensions"), INPUT_COUNT, INPUT_MIXED,
         *TOKEN_ID_RULES, *COMPACT_RULES, *LATE_RULES),
    ),
    task_route(
        "/embed", tei_embed, "Embeddings, in TEI's shape", "embed",
        ("the vectors", "tei_embed", "tei_embed"), {"inputs": ["a fine film"]}, EMBED_RULES,
    ),
    task_route(
        "/rerank", tei_rerank, "Rerank documents for a query, in TEI's shape", "rerank",
        ("highest score first", "tei_rerank", "tei_rerank"),
        {"query": "films", "texts": ["a film", "a cat"]},
    ),
    task_route(
        "/v1/rerank", cohere_rerank, "Rerank documents for a query, in Cohere's shape", "rerank",
        ("highest score first", "cohere_rerank", "cohere_rerank"),
        {"query": "films", "documents": ["a film", "a cat"]},
    ),
]  # fmt: skip


def task_routes(router: Router) -> None:
    router.mount(ROUTES)
