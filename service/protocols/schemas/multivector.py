"""POST /v1/embeddings/multi's body and answer (service/protocols/multivector.py): a ColBERT
model's token vectors, one matrix a text."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct
from ringserve.service.protocols.schemas import LongText, NonNegative, Text, Texts, narrowed, tasks


class MultiEmbeddings(LongText, kw_only=True):
    """A text or a list of texts, each encoded as a query (its prefix and [MASK] expansion) or
    a document (its prefix, its punctuation left out)."""

    input: Text | Texts
    input_type: Annotated[
        Literal["query", "document"], Meta(description="ColBERT's query or document encoding")
    ]


class MultiUsage(Struct, forbid_unknown_fields=True):
    prompt_tokens: NonNegative
    total_tokens: NonNegative


class MultiEmbedding(Struct, forbid_unknown_fields=True):
    index: NonNegative  # the text's, in the request
    embedding: list[list[float]]  # one vector a token kept, each of the model's dimension


class MultiEmbeddingList(Struct, forbid_unknown_fields=True):
    object: Literal["list"]
    data: list[MultiEmbedding]
    model: str
    usage: MultiUsage


def multi_answers(names: tuple[str, ...], dimension: int, max_texts: int) -> dict[str, Any]:
    """The answer with the model's dimension (0: a model without token vectors) and
    --max-texts."""
    d = max(dimension, 1)
    vector: Any = Annotated[list[float], Meta(min_length=d, max_length=d)]
    item: Any = narrowed(MultiEmbedding, embedding=Annotated[list[vector], Meta(min_length=1)])
    batch = Annotated[list[item], Meta(min_length=1, max_length=max_texts)]
    model = Literal[names] if names else str
    return {"multi_embeddings": narrowed(MultiEmbeddingList, data=batch, model=model)}


def rank_answers(max_documents: int) -> dict[str, Any]:
    """Cohere's rerank answers for a multivector model: its relevance_score is MaxSim, a sum
    over the query's tokens, not a probability (schemas/tasks.py rank_answers otherwise)."""

    def hits(kind: Any) -> Any:
        return Annotated[list[kind], Meta(min_length=1, max_length=max_documents)]

    hit = narrowed(tasks.CohereHit, relevance_score=float)
    hit_v2 = narrowed(tasks.CohereHitV2, relevance_score=float)
    return {
        "cohere_rerank": narrowed(tasks.CohereRanking, results=hits(hit)),
        "cohere_rerank_v2": narrowed(tasks.CohereRankingV2, results=hits(hit_v2)),
    }
