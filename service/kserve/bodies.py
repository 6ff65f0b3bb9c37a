"""KServe's inference request, declared once as msgspec Structs: HTTP decodes its JSON header
into `Infer` (protocols/kserve.py; its binary tensor data follows the header, outside JSON), and
gRPC builds the same `Infer` from its protobuf message (protocols/rpc/infer.py); kserve/reading.py
reads it into the job either way. The OpenAPI document shows them (protocols/schemas/kserve.py
has the answers')."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType
from ringserve.service.request.fields import Count, Text, Truncation

MAX_TIMEOUT_US = 86_400_000_000  # a day, as X-Request-Timeout-Ms allows
Region = Annotated[str, Meta(min_length=1, description="a registered shared-memory region")]
# [N] or [N, 1]: N texts. With prefixItems, JSON Schema's `items` speaks only of the items
# after them, so the first is stated again.
N_BY_1 = {"prefixItems": [{"type": "number", "minimum": 0, "multipleOf": 1}, {"const": 1}]}
Shape = Annotated[list[Count], Meta(min_length=1, max_length=2, extra_json_schema=N_BY_1)]


class Placement(Struct, kw_only=True):
    """Where a tensor lies in system shared memory (kserve/regions.py placement)."""

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
