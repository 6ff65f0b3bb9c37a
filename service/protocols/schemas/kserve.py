"""KServe v2's JSON bodies (service/protocols/kserve.py, shm_regions.py): the inference
request's header (its binary tensor data follows it, outside JSON), the repository extension's
load, unload and index, and the system shared-memory extension's register."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType
from ringserve.service.protocols.schemas import Count, Positive, Text, Truncation, narrowed

MAX_TIMEOUT_US = 86_400_000_000  # a day, as X-Request-Timeout-Ms allows
Region = Annotated[str, Meta(min_length=1, description="a registered shared-memory region")]
# [N] or [N, 1]: N texts. With prefixItems, JSON Schema's `items` speaks only of the items
# after them, so the first is stated again.
N_BY_1 = {"prefixItems": [{"type": "number", "minimum": 0, "multipleOf": 1}, {"const": 1}]}
Shape = Annotated[list[Count], Meta(min_length=1, max_length=2, extra_json_schema=N_BY_1)]


class Placement(Struct, kw_only=True):
    """Where a tensor lies in system shared memory (shm_regions.placement)."""

    shared_memory_region: Region | UnsetType = UNSET
    shared_memory_offset: Count | UnsetType = UNSET
    shared_memory_byte_size: Count | UnsetType = UNSET


class InputParameters(Placement, kw_only=True):
    binary_data_size: Count | UnsetType = UNSET  # its bytes follow the header, in input order


class InferInput(Struct, kw_only=True):
    name: Literal["text", "text_pair"]
    datatype: Literal["BYTES"]
    shape: Shape
    # row-major texts, flat or one a row ([["a"], ["b"]] for [N, 1]); none when the binary
    # extension or shared memory carries them
    data: list[Text | list[Text]] | UnsetType = UNSET
    parameters: InputParameters | None = None


class OutputParameters(Placement, kw_only=True):
    binary_data: bool | UnsetType = UNSET  # else the request's binary_data_output
    classification: None = None  # Triton's classification outputs are not served


# embedding: a model that embeds; sparse_*: a sparse model's; token_*: a token classifier's
# (protocols/token_classify.py)
OutputName = Literal[
    "scores", "label", "embedding", "sparse_indices", "sparse_values", "sparse_lengths",
    "token_labels", "token_scores", "token_offsets", "token_counts",
]  # fmt: skip


class InferOutput(Struct, kw_only=True):
    name: OutputName
    parameters: OutputParameters | None = None


Priority = Literal["interactive", "bulk"] | Count  # Triton's levels: 1 the highest
Timeout = Annotated[float, Meta(ge=1, le=MAX_TIMEOUT_US, multiple_of=1, description="µs")]


class InferParameters(Truncation, kw_only=True):
    binary_data_output: bool = False
    priority: Priority | None = None  # lowers the request's (never above its key's)
    timeout: Timeout | None = None
    prompt_name: str | None = None  # output embedding: one of the model's prompts
    stride: Count | None = None  # a token classifier: windows sharing this many tokens


class Infer(Struct, kw_only=True):
    """POST /v2/models/{model}/infer's JSON (the header, with binary tensor data)."""

    id: str | None = None
    parameters: InferParameters | None = None
    inputs: Annotated[list[InferInput], Meta(min_length=1, max_length=2)]
    outputs: list[InferOutput] | None = None


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
    """GET /v2/models/{model} (kserve.metadata_doc)."""

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
    """GET /v2/models/{model}/config (kserve.config_doc): Triton's configuration view."""

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
    """A cut or windowed text's counts (kserve.long_text_parameters), one a text, comma-joined:
    KServe parameters are scalars."""

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
    """A registered system shared-memory region (shm_regions.SystemRegions)."""

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
