"""TEI's bodies beside /embed and /rerank (service/protocols/tei_api.py): /predict, the
Inference API's text-classification on `POST /`, /similarity, /tokenize, /decode, /embed_all."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct
from ringserve.service.protocols.schemas import (
    Count,
    LongText,
    Named,
    NonNegative,
    Text,
    Texts,
    TokenIds,
    Truncation,
    narrowed,
)

Sequence = Annotated[list[Text], Meta(min_length=1, max_length=2)]  # [text] or [text, pair]
# TEI's PredictInput: a text, a sequence, or a batch of sequences (narrowed to --max-texts); a
# list that mixes texts with sequences, or of over two texts, is a 400 after decoding.
PredictInputs = Annotated[list[Text | Sequence], Meta(min_length=1)]


class Predict(LongText, kw_only=True):
    inputs: Text | PredictInputs
    raw_scores: bool = False


class ClassifyParameters(Struct, kw_only=True):
    top_k: Count | None = None  # 0 or null: every label
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = None  # the model's, or none


class HfClassify(Named, kw_only=True):
    """The Inference API's text-classification body, as huggingface_hub sends it."""

    inputs: Text | PredictInputs
    parameters: ClassifyParameters | None


class SimilarityInputs(Struct, kw_only=True):
    source_sentence: Text
    sentences: Texts  # narrowed to --max-texts less one (the source)


class SimilarityParameters(Truncation, kw_only=True):
    prompt_name: None = None  # not taken on /similarity


class Similarity(Named, kw_only=True):
    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None


class Tokenize(Named, kw_only=True):
    inputs: Text | Texts
    add_special_tokens: bool = True


class Decode(Named, kw_only=True):
    """Token ids, or a batch of lists of them (one kind a list: a mix is a 400)."""

    ids: Annotated[list[Count | TokenIds], Meta(min_length=1)]
    skip_special_tokens: bool = True


class EmbedAll(LongText, kw_only=True):
    """/embed's body without `normalize`: token vectors come as the encoder gives them."""

    inputs: Text | Texts
    prompt_name: str | None = None


# -- answers: built by tei_api, encoded by msgspec, and the document's schemas ------------------
class Prediction(Struct, forbid_unknown_fields=True):
    """A label and its score (highest first in a list)."""

    score: float  # the probability, or with raw_scores the score before the activation
    label: str


class Token(Struct, forbid_unknown_fields=True):
    """/tokenize's token: its id, the text it covers, and its UTF-8 byte offsets in the input
    (null for a special token, which covers none)."""

    id: Annotated[int, Meta(ge=0)]
    text: str
    special: bool
    start: Annotated[int, Meta(ge=0)] | None
    stop: Annotated[int, Meta(ge=0)] | None


def answers(labels: tuple[str, ...], max_texts: int) -> dict[str, Any]:
    """TEI's answers as a model with these labels gives them, with --max-texts."""
    pred = narrowed(Prediction, label=Literal[labels] if labels else str)
    ranking = Annotated[list[pred], Meta(min_length=1)]  # type: ignore[valid-type]

    def batch(item: Any, most: int = max_texts) -> Any:
        return Annotated[list[item], Meta(min_length=1, max_length=most)]

    return {
        "prediction": ranking,  # one text's (/predict)
        "predictions": batch(ranking),  # a batch's (/predict)
        "hf_classify": batch(list[pred]),  # type: ignore[valid-type]
        "similarity": batch(float, max(max_texts - 1, 1)),
        "tokenize": batch(list[Token]),
        "decode": batch(str),
    }


# TEI's ModelType: one of classifier, embedding, reranker, with its facts
ModelType = Annotated[
    dict[str, Any], Meta(extra_json_schema={"minProperties": 1, "maxProperties": 1})
]


class Info(Struct, kw_only=True, forbid_unknown_fields=True):
    """GET /info: the model's and the server's facts, in TEI's shape (tei_api.info_doc)."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: ModelType
    max_concurrent_requests: NonNegative
    max_input_length: NonNegative
    max_batch_tokens: NonNegative
    max_batch_requests: NonNegative | None
    max_client_batch_size: NonNegative
    auto_truncate: bool
    tokenization_workers: NonNegative
    version: str
    sha: str | None
    docker_label: str | None
    tasks: list[str]  # ringserve's: every task the model does


def info_answer(names: tuple[str, ...]) -> Any:
    return narrowed(Info, model_id=Literal[names] if names else str)
