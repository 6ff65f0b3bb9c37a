"""Cohere's v2 embed body (service/protocols/cohere_api.py); its v2 rerank is in tasks."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta
from ringserve.service.protocols.schemas import Named, Positive, Texts

InputType = Literal["search_document", "search_query", "classification", "clustering"]
EmbeddingType = Literal["float", "base64"]


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
