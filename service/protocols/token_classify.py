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
import numpy as np
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols import admit
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router, inference
from ringserve.service.protocols.schemas import UNSET, decode
from ringserve.service.protocols.schemas import tokens as bodies
from ringserve.service.protocols.schemas.tokens import TokenClassify, TokenEntity
from ringserve.service.request.errors import RequestError
from ringserve.service.request.lookup import needs_task, request_model
from ringserve.service.request.options import as_integer, long_text_options
from ringserve.service.views import FrontView
from ringserve.shm import layout as L
from ringserve.workers import token_entities as te

TASK = te.TASK
PATH = "/v1/token-classify"
# KServe's outputs: each text's tokens (special tokens left out), padded to the batch's longest
# (`token_counts` says how many are real): the top label, every label's probability, and the
# character offsets [start, end) into the text.
LABELS, SCORES, OFFSETS, COUNTS = "token_labels", "token_scores", "token_offsets", "token_counts"
OUTPUTS = (LABELS, SCORES, OFFSETS, COUNTS)
DEFAULT_IGNORE = ("O",)


def register(router: Router) -> None:
    router.add("POST", PATH, inference(router.server, token_classify))


def stride_of(value: Any, info: ModelInfo, where: str = "") -> int | None:
    """A request's `stride` (None: not given): an integer below max_length less the model's
    special tokens, so that each window moves on."""
    if value is None:
        return None
    m = info.manifest
    top = m.max_length - int(m.extra.get("special_tokens", 2)) - 1
    stride = as_integer(value)
    if stride is None or not 0 <= stride <= top:
        raise RequestError(
            400, f"{where}stride must be an integer from 0 to {top} (the model's max_length "
            f"{m.max_length} less its special tokens, less one)",
        )  # fmt: skip
    return stride


def payloads(texts: list[bytes], stride: int | None) -> list[bytes]:
    """The texts as the worker reads them: a stride, when given, in front of each."""
    if stride is None:
        return texts
    prefix = te.stride_prefix(stride)
    return [prefix + t for t in texts]


def windows_of(r: Result, n_labels: int) -> list[te.Window]:
    """A text's answer, window by window (shm/layout.py RSP_TOKEN_LABELS)."""
    return te.unpack(r.body or b"", r.windows, n_labels, L.RESPONSE_SIZE)


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
        raise RequestError(400, "stride reads a long text in windows: it goes without truncate")
    labels, aggregation = info.labels, body.aggregation
    ignore = frozenset(DEFAULT_IGNORE if body.ignore_labels is None else body.ignore_labels)
    threshold = body.threshold or 0.0
    if not 0.0 <= threshold <= 1.0:
        raise RequestError(400, "threshold must be a number from 0 to 1")
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


# -- KServe v2 ------------------------------------------------------------------------------------
def kserve_ask(
    texts: list[bytes],
    params: dict[str, Any],
    info: ModelInfo,
    deadline: int,
    priority: int | None,
    protocol: str,
) -> Ask:
    """A KServe call's core request to a token classifier: its texts (no pairs), its
    `truncate` and `truncation_direction`, and its `stride`, as /v1/token-classify's."""
    if any(L.PAIR_SEPARATOR in t for t in texts):
        raise RequestError(
            400, f"model {info.name} classifies the tokens of one text: no text_pair"
        )
    stride = stride_of(params.get("stride"), info, "parameters.")
    opts = long_text_options(params, "parameters.")
    if stride is not None and params.get("truncate") is not None:
        raise RequestError(
            400, "parameters.stride reads a long text in windows: no truncate with it"
        )
    return Ask(payloads(texts, stride), opts, TASK, info.index, deadline, priority, protocol)


def metadata_outputs(info: ModelInfo, kind: str, dims: str, config: bool) -> list[dict[str, Any]]:
    """The outputs in KServe's metadata (`config`: Triton's configuration, whose dims leave
    the batch out, and `token_counts`'s [1] is answered [N], as `label`'s)."""
    c = len(info.labels)
    if config:
        return [
            {"name": LABELS, kind: "TYPE_STRING", dims: [-1]},
            {"name": SCORES, kind: "TYPE_FP32", dims: [-1, c]},
            {"name": OFFSETS, kind: "TYPE_INT32", dims: [-1, 2]},
            {"name": COUNTS, kind: "TYPE_INT32", dims: [1], "reshape": {"shape": []}},
        ]
    return [
        {"name": LABELS, kind: "BYTES", dims: [-1, -1]},
        {"name": SCORES, kind: "FP32", dims: [-1, -1, c]},
        {"name": OFFSETS, kind: "INT32", dims: [-1, -1, 2]},
        {"name": COUNTS, kind: "INT32", dims: [-1]},
    ]


class TokenEncoder:
    """A group's answers as KServe's tensors (kserve.OutputEncoder's interface): each text's
    tokens once (a windowed text's overlap answered from the window where a token has the more
    context: token_entities.merged_tokens), padded to the longest text's count."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels
        self.blobs = [len(x.encode()).to_bytes(4, "little") + x.encode() for x in labels]

    def tensors(
        self,
        results: list[Result],
        wanted: list[tuple[str, bool]],
        places: dict[str, Any] | None = None,
        joined: bool = False,
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        from ringserve.service.protocols.shm_regions import REGIONS

        rows = [te.merged_tokens(windows_of(r, len(self.labels))) for r in results]
        tensors: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for name, binary in wanted:
            where = places.get(name) if places else None
            head, array = self.tensor(name, rows)
            if where is not None or binary:
                data = self.raw(name, array)
                if where is not None:
                    REGIONS.write(where, data)
                else:
                    head["parameters"] = {"binary_data_size": len(data)}
                    blobs.append(data)
            else:
                head["data"] = self.plain(name, array)
            tensors.append(head)
        return tensors, blobs

    def tensor(self, name: str, rows: list[te.Window]) -> tuple[dict[str, Any], np.ndarray]:
        n, c = len(rows), len(self.labels)
        width = max((len(w) for w in rows), default=0)
        if name == COUNTS:
            return _head(name, "INT32", [n]), np.array([len(w) for w in rows], dtype="<i4")
        if name == SCORES:
            out = np.zeros((n, width, c), dtype="<f4")
            for i, w in enumerate(rows):
                out[i, : len(w)] = w.probs
            return _head(name, "FP32", [n, width, c]), out
        if name == OFFSETS:
            spans = np.full((n, width, 2), -1, dtype="<i4")
            for i, w in enumerate(rows):
                spans[i, : len(w), 0], spans[i, : len(w), 1] = w.starts, w.ends
            return _head(name, "INT32", [n, width, 2]), spans
        ids = np.full((n, width), -1, dtype=np.int64)  # LABELS: -1 pads
        for i, w in enumerate(rows):
            ids[i, : len(w)] = w.probs.argmax(axis=1) if len(w) else []
        return _head(name, "BYTES", [n, width]), ids

    def raw(self, name: str, array: np.ndarray) -> bytes:
        if name != LABELS:
            return array.tobytes()
        empty = b"\0\0\0\0"
        return b"".join([self.blobs[i] if i >= 0 else empty for i in array.ravel().tolist()])

    def plain(self, name: str, array: np.ndarray) -> list[Any]:
        if name != LABELS:
            return array.ravel().tolist()
        return [self.labels[i] if i >= 0 else "" for i in array.ravel().tolist()]


def _head(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


def encoder(info: ModelInfo) -> TokenEncoder:
    return TokenEncoder(info.labels)
