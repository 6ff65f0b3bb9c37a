"""KServe v2's JSON bodies over HTTP (service/protocols/kserve.py, shm_regions.py) beside the
inference request's (service/kserve/bodies.py, which gRPC shares): the repository extension's
load, unload and index, the system shared-memory extension's register, and the answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType
from ringserve.service.kserve.bodies import OutputName
from ringserve.service.protocols.schemas import Count, Positive, narrowed


class RepositoryIndex(Struct, kw_only=True):
    ready: bool = False  # true: only the models that serve
    repository_name: str = ""


# Triton's `config` and `file:` overrides are not taken: refused after decoding, as the
# parameters are read whole (the schema says so beside the Struct's fields).
NO_OVERRIDES = {"properties": {"config": False}, "patternProperties": {"^file:": False}}


class LoadParameters(Struct, kw_only=True):
    version: Annotated[str | int, Meta(description="else the highest")] | None = None


class RepositoryLoad(Struct, kw_only=True):
    parameters: Annotated[LoadParameters, Meta(extra_json_schema=NO_OVERRIDES)] | None = None


class UnloadParameters(Struct, kw_only=True):
    unload_dependents: bool = False  # nothing depends on a model here


class RepositoryUnload(Struct, kw_only=True):
    parameters: UnloadParameters | None = None


class RegisterRegion(Struct, kw_only=True):
    """A region of a POSIX shared-memory object to map (the client's: never unlinked)."""

    key: str
    offset: Count = 0
    byte_size: Positive


class Anything(Struct, kw_only=True):
    """A body read and refused whatever it holds (CUDA shared memory is not served)."""


def extra_fields(kind: type[Struct], body: dict[str, Any]) -> list[str]:
    return [k for k in body if k not in kind.__struct_fields__]


# -- answers: the document's schemas of what kserve.py answers (gRPC answers the same facts) -----
Int = Annotated[int, Meta(ge=0)]
SHAPE_DIMS = Annotated[list[int], Meta(description="-1: any count")]


class ServerMetadata(Struct, forbid_unknown_fields=True):
    """GET /v2."""

    name: Literal["ringserve"]
    version: str
    extensions: list[str]


class TensorMetadata(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    name: str
    datatype: str
    shape: SHAPE_DIMS
    optional: bool | UnsetType = UNSET


class MetadataParameters(Struct, forbid_unknown_fields=True):
    task: str  # the model's tasks, comma-separated
    dimension: Int
    activation: str


class ModelMetadata(Struct, kw_only=True, forbid_unknown_fields=True):
    """GET /v2/models/{model} (kserve/documents.py metadata_doc)."""

    name: str
    versions: list[str]
    platform: str  # Triton's name of the runtime that serves (onnxruntime_onnx, ...)
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: MetadataParameters


class Reshape(Struct, forbid_unknown_fields=True):
    shape: list[int]


class ConfigTensor(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    name: str
    data_type: str
    dims: SHAPE_DIMS
    optional: bool | UnsetType = UNSET
    reshape: Reshape | UnsetType = UNSET  # label's [1] answered as [] (a scalar a row)


class DynamicBatching(Struct, forbid_unknown_fields=True):
    """Empty: the workers batch what arrives together."""


class StringValue(Struct, forbid_unknown_fields=True):
    string_value: str


class ModelConfig(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """GET /v2/models/{model}/config (kserve/documents.py config_doc): Triton's configuration
    view."""

    name: str
    platform: str
    max_batch_size: Int
    input: list[ConfigTensor]
    output: list[ConfigTensor]
    parameters: dict[str, StringValue]
    backend: str | UnsetType = UNSET
    dynamic_batching: DynamicBatching | UnsetType = UNSET


class ModelReady(Struct, forbid_unknown_fields=True):
    """GET /v2/models/{model}/ready: 200 ready, 503 not."""

    name: str
    ready: bool


class BinarySize(Struct, forbid_unknown_fields=True):
    binary_data_size: Int  # the output's bytes after the JSON header


# row-major numbers (FP32) or strings (BYTES): one kind a tensor
ONE_KIND = {"oneOf": [{"items": {"type": "number"}}, {"items": {"type": "string"}}]}
TensorData = Annotated[list[Any], Meta(extra_json_schema=ONE_KIND)]


class OutputTensor(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    name: OutputName
    # INT32: a sparse model's term ids and counts, a token classifier's offsets and counts
    datatype: Literal["FP32", "BYTES", "INT32"]
    shape: Annotated[list[Int], Meta(min_length=1, max_length=3)]
    data: TensorData | UnsetType = UNSET  # none when binary or in shared memory
    parameters: BinarySize | UnsetType = UNSET


class LongTextParameters(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A cut or windowed text's counts (kserve/encoder.py long_text_parameters), one a text,
    comma-joined: KServe parameters are scalars."""

    truncated: bool
    tokens: str
    windows: str | UnsetType = UNSET


class InferAnswer(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """POST /v2/models/{model}/infer's JSON (the header, when outputs are binary)."""

    model_name: str
    model_version: str
    outputs: list[OutputTensor]
    id: str | UnsetType = UNSET
    parameters: LongTextParameters | UnsetType = UNSET


class Duration(Struct, forbid_unknown_fields=True):
    count: Int
    ns: Int


class PhaseStats(Struct, forbid_unknown_fields=True):
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


class ModelStat(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """One (model, version)'s row of Triton's statistics (ops/inference_stats.py)."""

    name: str
    version: str
    last_inference: Int
    inference_count: Int
    execution_count: Int
    inference_stats: PhaseStats | UnsetType = UNSET
    batch_stats: list[dict[str, Any]] | UnsetType = UNSET


class ModelStats(Struct, forbid_unknown_fields=True):
    """GET /v2/models/stats and a model's /stats."""

    model_stats: list[ModelStat]


class RepositoryRow(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A (name, version) of the repository, loaded or not (POST /v2/repository/index)."""

    name: str
    state: Literal["LOADING", "READY", "UNLOADING", "UNAVAILABLE"]  # service/models/modelset.py
    version: str | UnsetType = UNSET
    reason: str | UnsetType = UNSET


class Done(Struct, forbid_unknown_fields=True):
    """`{}`: a repository or shared-memory call that succeeded."""


class RegionStatus(Struct, forbid_unknown_fields=True):
    """A registered system shared-memory region (kserve/regions.py SystemRegions)."""

    name: str
    key: str
    offset: Int
    byte_size: Int


def answers(
    names: tuple[str, ...], version: str, outputs: tuple[str, ...], max_texts: int
) -> dict[str, Any]:
    """KServe's answers with this server's facts: its models' names, their one version, the
    outputs its model gives."""
    name = Literal[names] if names else str
    answered = narrowed(OutputTensor, name=Literal[outputs])
    return {
        "server": ServerMetadata,
        "model": narrowed(
            ModelMetadata,
            name=name,
            versions=Annotated[list[str], Meta(extra_json_schema={"const": [version]})],
        ),
        "config": narrowed(ModelConfig, name=name),
        "ready": narrowed(ModelReady, name=name),
        "infer": narrowed(
            InferAnswer,
            model_name=name,
            model_version=Literal[(version,)],
            outputs=Annotated[list[answered], Meta(min_length=1, max_length=len(outputs))],  # type: ignore[valid-type]
        ),
        "stats": narrowed(ModelStats, model_stats=list[narrowed(ModelStat, name=name)]),  # type: ignore[misc]
        "rows": list[RepositoryRow],
        "done": Done,
        "regions": list[RegionStatus],
    }
