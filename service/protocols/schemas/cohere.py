"""Cohere's v2 embed body (service/protocols/cohere_api.py); its v2 rerank is in tasks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType, field
from ringserve.service.protocols.schemas import Named, Positive, Texts, narrowed

InputType = Literal["search_document", "search_query", "classification", "clustering"]
EmbeddingType = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]


class CohereEmbed(Named, kw_only=True):
    texts: Texts
    input_type: InputType | None = None
    embedding_types: Annotated[list[EmbeddingType], Meta(min_length=1)] | None = None
    # NONE refuses a long text, START drops its start, END (the default) its end
    truncate: Literal["NONE", "START", "END"] | None = None
    output_dimension: Positive | None = None  # at most the model's dimension
    max_tokens: None = None  # not taken: the model's max_length and truncate apply
    images: None = None  # only texts are embedded here
    inputs: None = None


class EmbeddingsByType(Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Each type asked for (`embedding_types`): the vectors, in the texts' order."""

    floats: list[list[float]] | UnsetType = field(default=UNSET, name="float")
    base64: list[str] | UnsetType = UNSET  # each the little-endian float32 bytes
    # compact vectors (service/protocols/compact.py): int8 and uint8 one a dimension, by the
    # artifact's calibration; binary and ubinary the sign bits packed, a byte each 8 dimensions
    int8: list[list[int]] | UnsetType = UNSET
    uint8: list[list[int]] | UnsetType = UNSET
    binary: list[list[int]] | UnsetType = UNSET
    ubinary: list[list[int]] | UnsetType = UNSET


class CohereEmbeddings(Struct, forbid_unknown_fields=True):
    """POST /v2/embed's answer (cohere_api.cohere_embed)."""

    id: str
    response_type: Literal["embeddings_by_type"]
    embeddings: EmbeddingsByType
    texts: list[str]
    meta: dict[str, Any]  # api_version, billed_units


def embed_answer(dimension: int) -> Any:
    d = max(dimension, 1)
    vector = Annotated[list[float], Meta(min_length=1, max_length=d)]

    def ints(low: int, high: int, most: int) -> Any:
        item = Annotated[int, Meta(ge=low, le=high)]
        return list[Annotated[list[item], Meta(min_length=1, max_length=most)]] | UnsetType

    packed = (d + 7) // 8
    by_type = narrowed(
        EmbeddingsByType,
        floats=list[vector] | UnsetType,
        int8=ints(-128, 127, d),
        uint8=ints(0, 255, d),
        binary=ints(-128, 127, packed),
        ubinary=ints(0, 255, packed),
    )
    return narrowed(CohereEmbeddings, embeddings=by_type)
