"""KServe's infer to a token classifier (task `token-classify`): its ask (texts without pairs,
the long-text options and `stride`, as /v1/token-classify's), the per-token outputs in metadata,
and the encoder that answers them (kserve/encoder.py OutputEncoder's interface)."""

from __future__ import annotations

from typing import Any

import numpy as np
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.kserve.bodies import InferParameters
from ringserve.service.kserve.regions import REGIONS
from ringserve.service.models.info import ModelInfo
from ringserve.service.request.errors import RequestError, Rule
from ringserve.service.request.tokens import TASK, payloads, stride_of, windows_of
from ringserve.shm import layout as L
from ringserve.workers import token_entities as te

# KServe's outputs: each text's tokens (special tokens left out), padded to the batch's longest
# (`token_counts` says how many are real): the top label, every label's probability, and the
# character offsets [start, end) into the text.
LABELS, SCORES, OFFSETS, COUNTS = "token_labels", "token_scores", "token_offsets", "token_counts"
OUTPUTS = (LABELS, SCORES, OFFSETS, COUNTS)
ONE_TEXT = Rule("model {model} classifies the tokens of one text: no text_pair")
STRIDE_TRUNCATE = Rule("parameters.stride reads a long text in windows: no truncate with it")


# -- KServe v2 ------------------------------------------------------------------------------------
def kserve_ask(
    texts: list[bytes],
    params: InferParameters,
    info: ModelInfo,
    deadline: int,
    priority: int | None,
    protocol: str,
) -> Ask:
    """A KServe call's core request to a token classifier: its texts (no pairs), its
    `truncate` and `truncation_direction`, and its `stride`, as /v1/token-classify's."""
    if any(L.PAIR_SEPARATOR in t for t in texts):
        raise RequestError(400, ONE_TEXT.say(model=info.name))
    stride = stride_of(params.stride, info, "parameters.")
    opts = params.options()
    if stride is not None and params.truncate is not None:
        raise RequestError(400, STRIDE_TRUNCATE.say())
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
    """A group's answers as KServe's tensors (encoder.py OutputEncoder's interface): each text's
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
