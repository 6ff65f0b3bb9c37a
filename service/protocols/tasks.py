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
from typing import Any, NamedTuple

import numpy as np
import orjson
from ringserve.service.engine.dispatcher import Result
from ringserve.service.model_info import ModelInfo
from ringserve.service.protocols import admit, prompts
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.http import Exchange, HttpError, HttpProtocol
from ringserve.service.protocols.routes import (
    Router,
    as_integer,
    inference,
    long_text_options,
    needs_task,
    pair_payloads,
    parse_json,
    request_model,
)
from ringserve.service.protocols.texts import require
from ringserve.service.protocols.vocab import id_list, text_of_ids
from ringserve.service.views import FrontView
from ringserve.shm import layout as L


def json_object(ex: Exchange) -> dict[str, Any]:
    doc = parse_json(ex)
    if not isinstance(doc, dict):
        raise HttpError(400, "body must be a JSON object")
    return doc


def text_list(value: Any, where: str, limit: int, one_ok: bool = True) -> list[bytes]:
    """A string (when `one_ok`) or a list of 1 to `limit` non-empty strings, as UTF-8."""
    if isinstance(value, str) and one_ok:
        return [require(value, where)]
    if not isinstance(value, list):
        kind = "a string or a list of strings" if one_ok else "a list of strings"
        raise HttpError(400, f"{where} must be {kind}")
    if not 1 <= len(value) <= limit:
        raise HttpError(400, f"{where} must hold 1 to {limit} items, not {len(value)}")
    return [require(t, f"{where}[{i}]") for i, t in enumerate(value)]


class Texts(NamedTuple):
    """A request's payloads, as written into the ring, and the options byte every one of them
    carries in its record (shm/layout.py OPT_*)."""

    payloads: list[bytes]
    options: int = 0


def with_options(doc: dict[str, Any], texts: list[bytes], embed: bool) -> Texts:
    """The texts with their options: `truncate` and friends, and OPT_EMBED."""
    return Texts(texts, long_text_options(doc, "") | (L.OPT_EMBED if embed else 0))


def submit_texts(
    server: FrontView,
    conn: HttpProtocol,
    ex: Exchange,
    texts: Texts,
    answer: Callable[[list[Result]], Any],
    task: str,
    info: ModelInfo,
) -> None:
    def done(results: list[Result]) -> None:
        doc = answer(results)
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        conn.respond(ex, 200, body, extra=[latency_header(conn, ex)])

    admission, model, options = server.admission, info.index, texts.options
    admit.submit(admission, conn, ex, texts.payloads, done, "http", task=task, model=model,
                 options=options)  # fmt: skip


# -- embeddings ----------------------------------------------------------------------------------
def vectors(results: list[Result], normalize: bool, keep: int = 0) -> np.ndarray:
    """The answers' embeddings [N, D] (or their first `keep` components), normalized when asked,
    in float64 until the end so that a cut vector's norm is 1 to float32 precision."""
    out = np.stack([np.asarray(r.scores, dtype=np.float64) for r in results])
    if keep:
        out = out[:, :keep]
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out.astype(np.float32)


def float_json(vecs: np.ndarray) -> bytes:
    """Float32 vectors (or one) as JSON arrays, each float in the shortest form that reads back
    as the same float32, in one C call (orjson). Measured on one 384-float vector: 6.7 us and
    4.2 KB, against 58 us and 5.3 KB for one "%.9g" format call over tolist() and 173 us for
    json.dumps (17 digits a float64); the answer's formatting was what kept embeddings/s below
    classify/s at c=64 on this 2-core machine (benchmarks/embed.py), the front-end sharing the
    cores with the workers."""
    return orjson.dumps(np.ascontiguousarray(vecs, dtype=np.float32), option=_NUMPY)


_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def dimensions(doc: dict[str, Any], dimension: int, key: str = "dimensions") -> int:
    """OpenAI's `dimensions` (Cohere's `output_dimension`): how many leading components to
    keep, 0 for all."""
    keep = doc.get(key)
    if keep is None:
        return 0
    n = as_integer(keep)
    if n is None or not 1 <= n <= dimension:
        raise HttpError(400, f"{key} must be an integer from 1 to the model's {dimension}")
    return n


def openai_embeddings(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    doc = json_object(ex)
    info = request_model(server, doc, vendor=True)  # OpenAI's "model"
    needs_task(info, "embed")
    if "input" not in doc:
        raise HttpError(400, 'body must have "input": a string or a list of strings')
    texts = openai_inputs(doc["input"], info, server.settings.max_texts)
    texts = prompts.with_prompt(info.manifest, doc.get("prompt_name"), texts)
    fmt = doc.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise HttpError(400, 'encoding_format must be "float" or "base64"')
    keep = dimensions(doc, info.manifest.dimension)
    name = info.name
    # A cut vector is renormalized (OpenAI's `dimensions`); a whole one as the model does.
    normalize = info.manifest.normalize or bool(keep)

    def answer(results: list[Result]) -> bytes:
        vecs = vectors(results, normalize, keep)
        data = b",".join(
            b'{"object":"embedding","index":%d,"embedding":%s}' % (i, _encode(v, fmt))
            for i, v in enumerate(vecs)
        )
        tokens = sum(r.tokens for r in results)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        tail = f'"model":{json.dumps(name)},"usage":{json.dumps(usage)}}}'.encode()
        return b'{"object":"list","data":[%s],%s' % (data, tail)

    submit_texts(server, conn, ex, with_options(doc, texts, embed=True), answer, "embed", info)


def openai_inputs(value: Any, info: ModelInfo, limit: int) -> list[bytes]:
    """OpenAI's `input`: a string, a list of strings, a list of token ids, or a list of such
    lists, as UTF-8 texts (ids spelled out by the model's tokenizer: service/protocols/vocab)."""
    ids = id_list(value, "input")
    if ids is not None:
        return [text_of_ids(info, ids, "input")]
    if not (isinstance(value, list) and value and all(isinstance(v, list) for v in value)):
        return text_list(value, "input", limit)
    if len(value) > limit:
        raise HttpError(400, f"input must hold 1 to {limit} items, not {len(value)}")
    out = []
    for i, item in enumerate(value):
        one = id_list(item, f"input[{i}]")
        if one is None:
            raise HttpError(400, f"input[{i}] must be a string or a non-empty list of token ids")
        out.append(text_of_ids(info, one, f"input[{i}]"))
    return out


def _encode(vec: np.ndarray, fmt: str) -> bytes:
    """One embedding as JSON: an array of floats, or OpenAI's base64 string of the
    little-endian float32 bytes."""
    if fmt == "base64":
        return b'"' + base64.b64encode(vec.astype("<f4").tobytes()) + b'"'
    return float_json(vec)


def tei_embed(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    doc = json_object(ex)
    info = request_model(server, doc)
    needs_task(info, "embed")
    if "inputs" not in doc:
        raise HttpError(400, 'body must have "inputs": a string or a list of strings')
    texts = text_list(doc["inputs"], "inputs", server.settings.max_texts)
    texts = prompts.with_prompt(info.manifest, doc.get("prompt_name"), texts)
    normalize = doc.get("normalize", True)
    if not isinstance(normalize, bool):
        raise HttpError(400, "normalize must be true or false")

    def answer(results: list[Result]) -> bytes:
        return float_json(vectors(results, normalize))  # the [N, D] matrix in one call

    submit_texts(server, conn, ex, with_options(doc, texts, embed=True), answer, "embed", info)


# -- rerank --------------------------------------------------------------------------------------
def top_n(doc: dict[str, Any], n: int) -> int:
    top = doc.get("top_n")
    if top is None:
        return n
    k = as_integer(top)
    if k is None or k < 1:
        raise HttpError(400, "top_n must be a positive integer")
    return min(k, n)


def flag(doc: dict[str, Any], key: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise HttpError(400, f"{key} must be true or false")
    return value


def ranked(results: list[Result], top: int, raw: bool = False) -> list[tuple[int, float]]:
    """(document index, score) highest first, ties in input order, cut at `top`. The score is
    the cross-encoder's sigmoid probability, or with `raw` its logit."""
    probs = np.array([float(r.scores[0]) for r in results], dtype=np.float64)  # type: ignore[index]
    if raw:
        p = np.clip(probs, 1e-45, 1 - 1e-7)
        probs = np.log(p) - np.log1p(-p)
    order = sorted(range(len(probs)), key=lambda i: -probs[i])[:top]
    return [(i, float(probs[i])) for i in order]


def rerank_pairs(info: ModelInfo, doc: dict[str, Any], docs: list[Any], where: str) -> Texts:
    needs_task(info, "rerank")
    query = require(doc.get("query"), "query")
    queries = [query] * len(docs)
    return with_options(doc, pair_payloads(queries, docs, where), embed=False)


def documents(doc: dict[str, Any], key: str, limit: int) -> list[str]:
    """The documents as strings; Cohere's may also be objects with a `text`."""
    items = doc.get(key)
    if not isinstance(items, list):
        raise HttpError(400, f'body must have "{key}": a list of strings')
    if not 1 <= len(items) <= limit:
        raise HttpError(400, f"{key} must hold 1 to {limit} documents, not {len(items)}")
    return [d["text"] if isinstance(d, dict) and "text" in d else d for d in items]


def tei_rerank(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    doc = json_object(ex)
    info = request_model(server, doc)
    docs = documents(doc, "texts", server.settings.max_documents)
    payloads = rerank_pairs(info, doc, docs, "texts")
    top, raw, with_text = (
        top_n(doc, len(docs)),
        flag(doc, "raw_scores"),
        flag(doc, "return_text"),
    )

    def answer(results: list[Result]) -> list[dict[str, Any]]:
        out = []
        for i, score in ranked(results, top, raw):
            item: dict[str, Any] = {"index": i, "score": score}
            if with_text:
                item["text"] = docs[i]
            out.append(item)
        return out

    submit_texts(server, conn, ex, payloads, answer, "rerank", info)


def cohere_rerank(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    doc = json_object(ex)
    info = request_model(server, doc, vendor=True)  # Cohere's "model"
    docs = documents(doc, "documents", server.settings.max_documents)
    payloads = rerank_pairs(info, doc, docs, "documents")
    top, with_docs = top_n(doc, len(docs)), flag(doc, "return_documents")

    def answer(results: list[Result]) -> dict[str, Any]:
        out = []
        for i, score in ranked(results, top):
            item: dict[str, Any] = {"index": i, "relevance_score": score}
            if with_docs:
                item["document"] = {"text": docs[i]}
            out.append(item)
        return {"results": out}

    submit_texts(server, conn, ex, payloads, answer, "rerank", info)


def task_routes(router: Router) -> None:
    s = router.server
    router.add("POST", "/v1/embeddings", inference(s, openai_embeddings))
    router.add("POST", "/embed", inference(s, tei_embed))
    router.add("POST", "/rerank", inference(s, tei_rerank))
    router.add("POST", "/v1/rerank", inference(s, cohere_rerank))
