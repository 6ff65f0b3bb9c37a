"""The body Structs of one server: each family's, with --max-texts and --max-documents set
(`narrowed`), made once a pair of limits and shared by the routes and /openapi.json."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Any

from msgspec import Meta
from ringserve.service.kserve.bodies import Infer
from ringserve.service.protocols.schemas import (
    Text,
    UnsetType,
    cohere,
    kserve,
    multivector,
    narrowed,
    sparse,
    tasks,
    tei,
    texts_of,
    v1,
)


@dataclass(frozen=True)
class Bodies:
    """One Struct a route's body (its name is the document's component)."""

    classify: type[v1.Classify]
    openai_embeddings: type[tasks.OpenAIEmbeddings]
    tei_embed: type[tasks.TeiEmbed]
    tei_rerank: type[tasks.TeiRerank]
    cohere_rerank: type[tasks.CohereRerank]
    cohere_rerank_v2: type[tasks.CohereRerankV2]
    cohere_embed: type[cohere.CohereEmbed]
    predict: type[tei.Predict]
    hf_classify: type[tei.HfClassify]
    similarity: type[tei.Similarity]
    tokenize: type[tei.Tokenize]
    decode: type[tei.Decode]
    embed_all: type[tei.EmbedAll]
    embed_sparse: type[sparse.EmbedSparse]
    sparse_embeddings: type[sparse.SparseEmbeddings]
    infer: type[Infer] = Infer
    repository_index: type[kserve.RepositoryIndex] = kserve.RepositoryIndex
    repository_load: type[kserve.RepositoryLoad] = kserve.RepositoryLoad
    repository_unload: type[kserve.RepositoryUnload] = kserve.RepositoryUnload
    register_region: type[kserve.RegisterRegion] = kserve.RegisterRegion
    anything: type[kserve.Anything] = kserve.Anything
    multi_embeddings: type[multivector.MultiEmbeddings] = multivector.MultiEmbeddings


def _list(item: Any, limit: int) -> Any:
    return Annotated[list[item], Meta(min_length=1, max_length=limit)]


@functools.lru_cache(maxsize=8)
def bodies(max_texts: int, max_documents: int) -> Bodies:
    texts = texts_of(max_texts)
    docs = _list(Text | tasks.Document, max_documents)
    predict = Text | _list(Text | tei.Sequence, max_texts)
    sentences = narrowed(tei.SimilarityInputs, sentences=texts_of(max(max_texts - 1, 1)))
    return Bodies(
        classify=narrowed(v1.Classify, texts=texts | UnsetType, text_pairs=texts | UnsetType),
        # one list of token ids is one text, as long as the model takes: a batch's count of
        # texts (--max-texts) is checked after decoding (tasks.openai_inputs)
        openai_embeddings=tasks.OpenAIEmbeddings,
        tei_embed=narrowed(tasks.TeiEmbed, inputs=Text | texts),
        tei_rerank=narrowed(tasks.TeiRerank, texts=docs),
        cohere_rerank=narrowed(tasks.CohereRerank, documents=docs),
        cohere_rerank_v2=narrowed(tasks.CohereRerankV2, documents=docs),
        cohere_embed=narrowed(cohere.CohereEmbed, texts=texts),
        predict=narrowed(tei.Predict, inputs=predict),
        hf_classify=narrowed(tei.HfClassify, inputs=predict),
        similarity=narrowed(tei.Similarity, inputs=sentences),
        tokenize=narrowed(tei.Tokenize, inputs=Text | texts),
        decode=tei.Decode,  # as /v1/embeddings' input: the count of a batch checked after
        embed_all=narrowed(tei.EmbedAll, inputs=Text | texts),
        multi_embeddings=narrowed(multivector.MultiEmbeddings, input=Text | texts),
        embed_sparse=narrowed(sparse.EmbedSparse, inputs=Text | texts),
        sparse_embeddings=narrowed(sparse.SparseEmbeddings, input=Text | texts),
    )


def of(settings: Any) -> Bodies:
    """The Structs for a server's Config."""
    return bodies(settings.max_texts, settings.max_documents)
