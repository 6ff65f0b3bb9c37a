"""Our JSON API's body: POST /v1/classify (service/protocols/routes.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct
from ringserve.service.protocols.schemas import (
    UNSET,
    LongText,
    NonNegative,
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
    # --precision int8-checked: which precision's scores these are (int8's, or fp32's for a
    # close call that was looked at again)
    precision: Literal["int8", "fp32"] | UnsetType = UNSET


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


class ModelCard(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """GET /v1/model: the model, as routes.model_card fills it."""

    name: str
    labels: list[str]
    max_length: NonNegative
    fingerprint: str
    activation: Literal["softmax", "sigmoid"]
    architecture: str
    device: str
    buckets: list[NonNegative]
    length_classes: list[NonNegative]
    runtime: str  # torch, onnx or openvino
    precision: str
    task: list[str]
    dimension: NonNegative
    prompts: dict[str, str] | UnsetType = UNSET  # sentence-transformers' (prompt_name)
    default_prompt_name: str | UnsetType | None = UNSET
    precision_chosen_by: str | UnsetType = UNSET  # --precision auto: what it resolved to, why
    # ONNX Runtime at fp32: the graph serving (plain or fused), what chose it, its timings
    graph: dict[str, Any] | UnsetType = UNSET
    int8: dict[str, Any] | UnsetType = UNSET  # the int8 cost measured at export
    bf16: dict[str, Any] | UnsetType = UNSET  # bf16's on OpenVINO, where built on a bf16 CPU
    # int8-checked's threshold and cost (the publication split), when it serves
    int8_checked: dict[str, Any] | UnsetType = UNSET
    # an embed model's compact vectors: recall@10 of int8 and binary, and what calibrated them
    compact: dict[str, Any] | UnsetType = UNSET


class NamedModelCard(ModelCard, kw_only=True):
    """GET /v1/models/{model}: the card with OpenAI's model object's fields."""

    id: str
    object: Literal["model"]
    created: NonNegative  # the artifact's manifest's modification time (Unix seconds)
    owned_by: str


class ModelRow(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """One model the server holds, in any state (service/models/modelset.py)."""

    name: str
    version: str
    state: Literal["LOADING", "READY", "UNLOADING", "UNAVAILABLE"]
    task: list[str]
    labels: list[str]
    prompts: dict[str, str] | UnsetType = UNSET
    default_prompt_name: str | UnsetType | None = UNSET


class ModelEntry(ModelRow, kw_only=True):
    """A row with OpenAI's model object's fields (the `data` of GET /v1/models)."""

    id: str
    object: Literal["model"]
    created: NonNegative
    owned_by: str


class ModelList(Struct, kw_only=True, forbid_unknown_fields=True):
    """GET /v1/models: OpenAI's list shape (`data`) and, as before, `models`."""

    object: Literal["list"]
    data: list[ModelEntry]
    models: list[ModelRow]


def model_answers(
    names: tuple[str, ...], labels: list[str], tasks: list[str], dimension: int
) -> dict[str, Any]:
    """The model cards as this server's first model fills them (its facts as constants)."""
    facts = {
        "name": Literal[names] if names else str,
        "labels": Annotated[list[str], Meta(extra_json_schema={"const": labels})],
        "task": Annotated[list[str], Meta(extra_json_schema={"const": tasks})],
        "dimension": Annotated[int, Meta(ge=0, extra_json_schema={"const": dimension})],
    }
    return {
        "model": narrowed(ModelCard, **facts),
        "named_model": narrowed(NamedModelCard, **facts),
        "models": ModelList,
    }
