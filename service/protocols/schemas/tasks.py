"""The embed and rerank bodies in the shapes RAG tools send (service/protocols/tasks.py):
OpenAI's /v1/embeddings, TEI's /embed and /rerank, Cohere's /v1/rerank and /v2/rerank."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType
from ringserve.service.protocols.schemas import (
    Count,
    LongText,
    NonNegative,
    Positive,
    Text,
    Texts,
    TokenIds,
    narrowed,
)

# OpenAI's `input`: a text, or a list of texts, of token ids, or of lists of token ids (one
# kind a list: a mix is a 400 after decoding).
Inputs = Annotated[list[Text | Count | TokenIds], Meta(min_length=1)]


# A vector's encoding: float32 as JSON numbers (or OpenAI's base64 of them), or compact, as
# JSON integers (service/protocols/compact.py): int8/uint8 one a dimension by the artifact's
# calibration, binary/ubinary the sign bits packed eight a byte.
Compact = Literal["int8", "uint8", "binary", "ubinary"]
LATE_CHUNKING = (
    "the inputs are the chunks of one document: embedded together, each chunk's tokens "
    "pooled into its own vector (service/protocols/late_chunking.py)"
)


class OpenAIEmbeddings(LongText, kw_only=True):
    input: Text | Inputs
    encoding_format: Literal["float", "base64"] | Compact = "float"
    dimensions: Positive | None = None  # at most the model's dimension
    prompt_name: str | None = None  # one of the model's sentence-transformers prompts
    late_chunking: Annotated[bool, Meta(description=LATE_CHUNKING)] = False


class TeiEmbed(LongText, kw_only=True):
    inputs: Text | Texts
    normalize: bool = True
    prompt_name: str | None = None
    encoding_format: Literal["float"] | Compact = "float"
    late_chunking: Annotated[bool, Meta(description=LATE_CHUNKING)] = False


class Document(Struct):
    """A document as an object (Cohere's v1 shape): its `text` is what is ranked."""

    text: Text


Documents = Annotated[list[Text | Document], Meta(min_length=1)]  # narrowed to --max-documents


class Rerank(LongText, kw_only=True):
    """What every rerank body has: a query, its documents, how many to answer."""

    query: Text
    top_n: Positive | None = None


class TeiRerank(Rerank, kw_only=True):
    texts: Documents
    raw_scores: bool = False
    return_text: bool = False


class CohereRerank(Rerank, kw_only=True):
    documents: Documents
    return_documents: bool = False


class CohereRerankV2(Rerank, kw_only=True):
    documents: Documents
    max_tokens_per_doc: None = None  # not taken: the model's max_length applies


# -- answers: built by the rerank handlers, encoded by msgspec, and the document's schemas --------
Probability = Annotated[float, Meta(ge=0, le=1)]


class TeiHit(Struct, omit_defaults=True, forbid_unknown_fields=True):
    index: NonNegative  # the document's, in the request
    score: float  # the probability, or with raw_scores its logit
    text: str | UnsetType = UNSET  # return_text


class DocumentText(Struct, forbid_unknown_fields=True):
    text: str


class CohereHit(Struct, omit_defaults=True, forbid_unknown_fields=True):
    index: NonNegative
    relevance_score: Probability
    document: DocumentText | UnsetType = UNSET  # return_documents


class CohereRanking(Struct, forbid_unknown_fields=True):
    results: list[CohereHit]


class CohereHitV2(Struct, forbid_unknown_fields=True):
    index: NonNegative
    relevance_score: Probability


class CohereRankingV2(Struct, forbid_unknown_fields=True):
    id: str
    results: list[CohereHitV2]
    meta: dict[str, Any]  # api_version, billed_units


def rank_answers(max_documents: int) -> dict[str, Any]:
    """The rerank answers with --max-documents (one hit a document at most)."""

    def hits(kind: Any) -> Any:
        return Annotated[list[kind], Meta(min_length=1, max_length=max_documents)]

    return {
        "tei_rerank": hits(TeiHit),
        "cohere_rerank": narrowed(CohereRanking, results=hits(CohereHit)),
        "cohere_rerank_v2": narrowed(CohereRankingV2, results=hits(CohereHitV2)),
    }


# -- the embeddings' answers: orjson writes OpenAI's and TEI's vectors (tasks.float_json, for
# speed), msgspec Cohere's; these are their schemas in the document ---------------------------
Base64 = Annotated[str, Meta(extra_json_schema={"contentEncoding": "base64"})]


class Embedding(Struct, forbid_unknown_fields=True):
    object: Literal["embedding"]
    index: NonNegative
    # base64: the little-endian float32 bytes; compact encodings are JSON integers (numbers)
    embedding: list[float] | Base64


class Usage(Struct, forbid_unknown_fields=True):
    prompt_tokens: NonNegative
    total_tokens: NonNegative


class EmbeddingList(Struct, forbid_unknown_fields=True):
    """POST /v1/embeddings (tasks.openai_embeddings)."""

    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


def embed_answers(names: tuple[str, ...], dimension: int, max_texts: int) -> dict[str, Any]:
    """The embeddings' answers with the model's dimension and --max-texts."""
    d = max(dimension, 1)

    def batch(item: Any) -> Any:
        return Annotated[list[item], Meta(min_length=1, max_length=max_texts)]

    # float: d numbers; compact: int8/uint8 d integers, binary/ubinary a byte each 8 dimensions
    vector = Annotated[list[float], Meta(min_length=1, max_length=d)]
    item = narrowed(Embedding, embedding=vector | Base64)
    # a late-chunked document answers a vector a chunk, up to --max-texts chunks
    return {
        "openai_embeddings": narrowed(
            EmbeddingList, data=batch(item), model=Literal[names] if names else str
        ),
        "tei_embed": batch(vector),
        "embed_all": list[list[list[float]]],
    }
