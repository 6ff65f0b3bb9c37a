"""Our JSON API's body: POST /v1/classify (service/protocols/routes.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct
from ringserve.service.protocols.schemas import (
    UNSET,
    LongText,
    Text,
    Texts,
    UnsetType,
    narrowed,
)


class Classify(LongText, kw_only=True):
    """A text (with its pair), or a batch of texts (with theirs): one of `text` or `texts`."""

    text: Text | UnsetType = UNSET
    text_pair: Text | UnsetType = UNSET
    texts: Texts | UnsetType = UNSET
    text_pairs: Texts | UnsetType = UNSET


def _alone(field: str, *others: str) -> dict[str, Any]:
    return {"required": [field], "not": {"anyOf": [{"required": [o]} for o in others]}}


# What the schema adds to the Struct's: exactly one of `text` or `texts`, each pair with its own.
ONE_OR_MANY = {
    "oneOf": [_alone("text", "texts", "text_pairs"), _alone("texts", "text", "text_pair")]
}


# -- answers: built by routes.classify, encoded by msgspec, and the document's schemas ----------
class ClassifyResult(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """One text's answer: its label, and every label's score in label order."""

    label: str
    label_id: int
    scores: list[float]
    truncated: Literal[True] | UnsetType = UNSET  # cut to max_length (`tokens` before the cut)
    tokens: int | UnsetType = UNSET
    windows: int | UnsetType = UNSET  # windowed: how many windows it took


class ClassifyBatch(Struct, forbid_unknown_fields=True):
    results: list[ClassifyResult]


def answers(labels: tuple[str, ...], max_texts: int) -> tuple[Any, Any]:
    """(ClassifyResult, ClassifyBatch) as a model with these labels answers them: for the
    document (the handler encodes the plain Structs, which write the same JSON)."""
    n = len(labels)
    score = Annotated[float, Meta(ge=0, le=1)]
    result = narrowed(
        ClassifyResult,
        label=Literal[labels] if labels else str,
        label_id=Annotated[int, Meta(ge=0, le=max(n - 1, 0))],
        scores=Annotated[list[score], Meta(min_length=n, max_length=n)],
        tokens=Annotated[int, Meta(ge=0)] | UnsetType,
        windows=Annotated[int, Meta(ge=0)] | UnsetType,
    )
    results = Annotated[list[result], Meta(min_length=1, max_length=max_texts)]  # type: ignore[valid-type]
    return result, narrowed(ClassifyBatch, results=results)
