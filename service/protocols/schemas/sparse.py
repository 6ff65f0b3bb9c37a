"""A sparse (SPLADE) model's bodies and answers: TEI's /embed_sparse, and ringserve's
/v1/embeddings/sparse with its pruning (`top_k`, `threshold`) and the terms' strings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct
from ringserve.service.protocols.schemas import (
    UNSET,
    LongText,
    NonNegative,
    Positive,
    Text,
    Texts,
    UnsetType,
)


class EmbedSparse(LongText, kw_only=True):
    """TEI's /embed_sparse body: a text or a list of them."""

    inputs: Text | Texts
    prompt_name: str | None = None


class SparseEmbeddings(LongText, kw_only=True):
    """/v1/embeddings/sparse: OpenAI's `input`, and what to keep of each vector."""

    input: Text | Texts
    top_k: Annotated[Positive, Meta(description="keep the heaviest k terms")] | None = None
    threshold: (
        Annotated[float, Meta(ge=0, description="keep the terms weighing more than this")] | None
    ) = None
    return_tokens: Annotated[bool, Meta(description="each term's token string too")] = False
    prompt_name: str | None = None


class SparseValue(Struct, forbid_unknown_fields=True):
    """TEI's term: a vocabulary id and its weight."""

    index: NonNegative
    value: float


class SparseVector(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One text's terms: ids ascending, their weights, and (return_tokens) their strings."""

    index: NonNegative  # the text's place in `input`
    indices: list[NonNegative]
    values: list[float]
    object: Literal["sparse_embedding"] = "sparse_embedding"
    tokens: list[str] | UnsetType = UNSET


class SparseUsage(Struct, forbid_unknown_fields=True):
    prompt_tokens: NonNegative
    total_tokens: NonNegative


class SparseList(Struct, forbid_unknown_fields=True):
    """/v1/embeddings/sparse's answer, in OpenAI's list shape."""

    object: Literal["list"]
    data: list[SparseVector]
    model: str
    usage: SparseUsage


def answers(max_texts: int) -> dict[str, Any]:
    """The answers' types with --max-texts (the OpenAPI document's)."""
    batch = Annotated[list[list[SparseValue]], Meta(min_length=1, max_length=max_texts)]
    return {"embed_sparse": batch, "sparse_embeddings": SparseList}
