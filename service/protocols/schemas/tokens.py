"""POST /v1/token-classify's body and answers (service/protocols/token_classify.py)."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct
from ringserve.service.protocols.schemas import (
    UNSET,
    Count,
    LongText,
    Text,
    Texts,
    UnsetType,
    components,
    narrowed,
    texts_of,
)
from ringserve.workers.token_entities import AGGREGATIONS

Aggregation = Literal[AGGREGATIONS]  # type: ignore[valid-type]
# 0 to 1, checked after decoding (token_classify.py): msgspec's own message for a bound would
# call the number an integer, as it does for the bodies' counts (schemas.message)
UNIT = {"minimum": 0, "maximum": 1}
Threshold = Annotated[float, Meta(extra_json_schema=UNIT, description="drop entities below")]


class TokenClassify(LongText, kw_only=True):
    """A text, or a batch of texts: one of `text` or `texts`; how to make entities of the
    tokens' labels (transformers' aggregation_strategy), which to drop, and how long texts are
    read (`stride`: in windows overlapping by that many tokens)."""

    text: Text | UnsetType = UNSET
    texts: Texts | UnsetType = UNSET
    aggregation: Annotated[Aggregation, Meta(description="as transformers' pipeline")] = "simple"
    threshold: Threshold | None = None
    ignore_labels: Annotated[list[str], Meta(description='default ["O"]')] | None = None
    stride: Annotated[Count, Meta(description="tokens two windows share")] | None = None


# What the schema adds to the Struct's: exactly one of `text` or `texts`.
ONE_OR_MANY = {
    "oneOf": [
        {"required": ["text"], "not": {"required": ["texts"]}},
        {"required": ["texts"], "not": {"required": ["text"]}},
    ]
}


class TokenEntity(Struct, kw_only=True, forbid_unknown_fields=True):
    """One entity (with aggregation `none`, one token): its label (the model's, less `B-` or
    `I-` once grouped), its score, and where it is in the text (character offsets)."""

    label: str
    score: float
    start: int
    end: int
    text: str  # text[start:end]


class TokenClassifyBatch(Struct, forbid_unknown_fields=True):
    results: list[list[TokenEntity]]


@functools.lru_cache(maxsize=8)
def body(max_texts: int) -> type[TokenClassify]:
    """The body with --max-texts set."""
    return narrowed(TokenClassify, texts=texts_of(max_texts) | UnsetType)


@functools.lru_cache(maxsize=8)
def schemas(max_texts: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the request's schema, the answer's, their components) for /openapi.json."""
    score = Annotated[float, Meta(ge=0, le=1)]
    offset = Annotated[int, Meta(ge=0)]
    entity = narrowed(TokenEntity, score=score, start=offset, end=offset)
    one = Annotated[list[entity], Meta(description="one text's entities, in text order")]  # type: ignore[valid-type]
    many = Annotated[list[one], Meta(min_length=1, max_length=max_texts)]
    batch = narrowed(TokenClassifyBatch, results=many)
    (request, one_ref, batch_ref), defs = components([body(max_texts), one, batch])
    return {"allOf": [request, ONE_OR_MANY]}, {"oneOf": [one_ref, batch_ref]}, defs
