"""KServe v2's JSON bodies (service/protocols/kserve.py, shm_regions.py): the inference
request's header (its binary tensor data follows it, outside JSON), the repository extension's
load, unload and index, and the system shared-memory extension's register."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType
from ringserve.service.protocols.schemas import Count, Positive, Text, Truncation

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


class InferOutput(Struct, kw_only=True):
    name: Literal["scores", "label", "embedding"]  # embedding: a model that embeds
    parameters: OutputParameters | None = None


Priority = Literal["interactive", "bulk"] | Count  # Triton's levels: 1 the highest
Timeout = Annotated[float, Meta(ge=1, le=MAX_TIMEOUT_US, multiple_of=1, description="µs")]


class InferParameters(Truncation, kw_only=True):
    binary_data_output: bool = False
    priority: Priority | None = None  # lowers the request's (never above its key's)
    timeout: Timeout | None = None
    prompt_name: str | None = None  # output embedding: one of the model's prompts


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
