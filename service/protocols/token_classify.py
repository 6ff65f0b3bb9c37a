"""Token classification (named entities, PII, part of speech): POST /v1/token-classify, and the
per-token outputs KServe v2 answers (HTTP, protocols/kserve.py, and gRPC, protocols/rpc/infer.py)
for a model whose task is `token-classify`.

The worker answers each text with every real token's label probabilities, character offsets and
subword mark (workers/process/tokens.py), window by window. The entities are made here, in the
front-end, because what a request asks of them (the aggregation, the labels it ignores, its
threshold) never reaches the worker: the worker's answer is the same for every request, the
ring carries no per-request table, and each text's grouping is a few microseconds of numpy and
a loop over its words, beside the model's milliseconds (workers/token_entities.py makes them
as transformers' pipeline does). KServe's outputs are that answer as tensors.
"""

from __future__ import annotations

from typing import Any

import msgspec
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.protocols import admit
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router, task_route
from ringserve.service.protocols.schemas import UNSET, decode
from ringserve.service.protocols.schemas import tokens as bodies
from ringserve.service.protocols.schemas.tokens import TokenClassify, TokenEntity
from ringserve.service.request.errors import RequestError, Rule
from ringserve.service.request.lookup import needs_task, request_model
from ringserve.service.request.tokens import STRIDE, TASK, payloads, stride_of, windows_of
from ringserve.service.views import FrontView
from ringserve.workers import token_entities as te

PATH = "/v1/token-classify"
DEFAULT_IGNORE = ("O",)


# What a body the schema allows can still be refused for (listed in the document: ROUTES, and
# KServe's infer route for a token classifier, kserve.ROUTES; STRIDE is request/tokens.py's)
STRIDE_TRUNCATE = Rule("stride reads a long text in windows: it goes without truncate")
THRESHOLD = Rule("threshold must be a number from 0 to 1")


def register(router: Router) -> None:
    router.mount(ROUTES)


# -- POST /v1/token-classify ----------------------------------------------------------------------
def token_classify(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    body = decode(ex, bodies.body(server.settings.max_texts))
    info = request_model(server, body)
    needs_task(info, TASK)
    texts, single = texts_of(body)
    stride = stride_of(body.stride, info)
    if stride is not None and body.truncate is not None:
        raise RequestError(400, STRIDE_TRUNCATE.say())
    labels, aggregation = info.labels, body.aggregation
    ignore = frozenset(DEFAULT_IGNORE if body.ignore_labels is None else body.ignore_labels)
    threshold = body.threshold or 0.0
    if not 0.0 <= threshold <= 1.0:
        raise RequestError(400, THRESHOLD.say())
    strings = [t.decode() for t in texts]
    ask = Ask(payloads(texts, stride), body.options(), TASK, info.index)

    def done(results: list[Result]) -> None:
        n = len(labels)
        found = [
            entity_list(text, windows_of(r, n), labels, aggregation, ignore, threshold)
            for text, r in zip(strings, results, strict=True)
        ]
        doc: Any = found[0] if single else bodies.TokenClassifyBatch(found)
        conn.respond(ex, 200, msgspec.json.encode(doc), extra=[latency_header(conn, ex)])

    admit.submit(server.admission, conn, ex, ask, done)


def texts_of(body: TokenClassify) -> tuple[list[bytes], bool]:
    """(the texts, whether it is one): exactly one of `text` and `texts`."""
    if isinstance(body.text, str) and body.texts is UNSET:
        return [body.text.encode()], True
    if isinstance(body.texts, list) and body.text is UNSET:
        return [t.encode() for t in body.texts], False
    raise RequestError(400, 'body must have exactly one of "text" or "texts"')


def entity_list(
    text: str,
    windows: list[te.Window],
    labels: list[str],
    aggregation: str,
    ignore: frozenset[str],
    threshold: float,
) -> list[TokenEntity]:
    """One text's entities as its answer writes them."""
    return [
        TokenEntity(label=label, score=score, start=start, end=end, text=text[start:end])
        for label, score, start, end in te.entities(windows, labels, aggregation, ignore)
        if score >= threshold
    ]


ROUTES = [
    task_route(
        PATH, token_classify,
        "Entities in a text, or a batch, as transformers' token-classification pipeline", TASK,
        ("one text's entities, or {results} for texts",
         lambda d: bodies.schemas(d.facts.max_texts)[0],
         lambda d: bodies.schemas(d.facts.max_texts)[1]),
        {"text": "Angela Merkel visited Paris", "aggregation": "simple"},
        (STRIDE, STRIDE_TRUNCATE, THRESHOLD),
    ),
]  # fmt: skip
