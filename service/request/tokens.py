"""A token classifier's request and answer as every route reads them (/v1/token-classify and
KServe's infer): the `stride` of windows over a long text, the payloads that carry it to the
worker, and a text's answer window by window (workers/token_entities.py)."""

from __future__ import annotations

from typing import Any

from ringserve.service.engine.requests import Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.request.errors import RequestError, Rule
from ringserve.service.request.options import as_integer
from ringserve.shm import layout as L
from ringserve.workers import token_entities as te

TASK = te.TASK
STRIDE = Rule(
    "{where}stride must be an integer from 0 to {top} (the model's max_length {max_length} less "
    "its special tokens, less one)"
)


def stride_of(value: Any, info: ModelInfo, where: str = "") -> int | None:
    """A request's `stride` (None: not given): an integer below max_length less the model's
    special tokens, so that each window moves on."""
    if value is None:
        return None
    m = info.manifest
    top = m.max_length - int(m.extra.get("special_tokens", 2)) - 1
    stride = as_integer(value)
    if stride is None or not 0 <= stride <= top:
        raise RequestError(400, STRIDE.say(where=where, top=top, max_length=m.max_length))
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
