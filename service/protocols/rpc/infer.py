"""ModelInfer's request and answer: the protobuf message converted into the `Infer` Struct that
HTTP decodes (service/kserve/bodies.py) and read by the same code (kserve/reading.py), so HTTP
and gRPC refuse the same things alike; the answer's tensors (kserve/encoder.py) written as a
ModelInferResponse.

A tensor travels as typed contents (`bytes_contents`, `fp32_contents`) or as raw bytes
(`raw_input_contents`, `raw_output_contents`, the binary tensor extension's layout); inputs are
taken either way: raw ones as the binary extension's tensor data, each input's
`binary_data_size` its bytes, typed ones as the input's data. Answers are raw, as Triton gives
them: tritonclient.grpc reads FP32 outputs only from raw contents (and its typed BYTES path
fails under numpy 2). A request parameter `binary_data_output: false`, or an output's
`binary_data: false`, as on HTTP, asks for typed contents instead (for all outputs: raw is all
or none, as KServe has it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ringserve.service.engine.requests import Result
from ringserve.service.kserve.bodies import (
    Infer,
    InferInput,
    InferOutput,
    InferParameters,
    InputParameters,
    OutputParameters,
)
from ringserve.service.kserve.encoder import outputs
from ringserve.service.kserve.reading import InferJob, check_input_names, read_job
from ringserve.service.kserve.regions import PARAM_REGION
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols.rpc import kserve_pb2 as pb
from ringserve.service.request.errors import RequestError
from ringserve.service.request.fields import convert
from ringserve.service.request.lookup import find_model
from ringserve.service.views import FrontView

# Raw answers unless a call asks otherwise (what a call without parameters converts to).
DEFAULTS = {"binary_data_output": True}
NO_PARAMETERS = InferParameters(binary_data_output=True)
# The parameters the Structs read; others are ignored, as before the Structs read them.
PLACEMENT = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
OUTPUT_PARAMETERS = (*PLACEMENT, "binary_data", "classification")


def param_value(p: pb.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def params_dict(params: Any) -> dict[str, Any]:
    if not params:  # most calls set none: no walk over the empty map
        return {}
    return {k: param_value(v) for k, v in params.items()}


def check_model(server: FrontView, name: str, version: str) -> ModelInfo:
    """The loaded model a call names (an empty version: the one that serves), else 404."""
    if not name:
        raise RequestError(404, "unknown model: a call must name one")
    return find_model(server, name, version or None)


def read_request(
    server: FrontView, req: pb.ModelInferRequest, deadline_of: Callable[[int | None], int]
) -> InferJob:
    """The call's job, its deadline the call's own, else `deadline_of` the `timeout` parameter
    (Triton's, in microseconds; None when unset)."""
    info = check_model(server, req.model_name, req.model_version)
    header, blob = infer_of(req)
    job = read_job(server, info, header, memoryview(blob), deadline_of, "grpc")
    if header.outputs and any(o.parameters is not None for o in header.outputs):
        raw = all(binary for _, binary in job.wanted)  # raw is all outputs or none (KServe)
        job.wanted = [(name, raw) for name, _ in job.wanted]
    return job


def infer_of(req: pb.ModelInferRequest) -> tuple[Infer, bytes]:
    """The call as the `Infer` Struct, and its raw inputs as the binary tensor data after it.
    Built, not converted: kserve/reading.py checks each field as it reads it, so a bad one is
    refused in the same words as over HTTP."""
    specs = list(req.inputs)
    check_input_names([spec.name for spec in specs])
    given = [params_dict(spec.parameters) for spec in specs]  # each input's, read once
    raws = list(req.raw_input_contents)
    in_shm = sum(PARAM_REGION in p for p in given)
    if raws and len(raws) != len(specs) - in_shm:
        raise RequestError(400, f"{len(raws)} raw_input_contents for {len(specs)} inputs")
    inputs = []
    blob = []
    for spec, params in zip(specs, given, strict=True):
        # raw contents in order, for the inputs not in shared memory
        raw = raws.pop(0) if raws and PARAM_REGION not in params else None
        inputs.append(input_of(spec, params, raw))
        if raw is not None:
            blob.append(raw)
    params = params_dict(req.parameters)
    # checked as the HTTP header's are (none given: the defaults, without converting)
    checked = convert(DEFAULTS | params, InferParameters, "parameters") if params else NO_PARAMETERS
    asked = [output_of(o) for o in req.outputs] or None
    header = Infer(id=req.id, parameters=checked, inputs=inputs, outputs=asked)
    return header, blob[0] if len(blob) == 1 else b"".join(blob)


def input_of(
    spec: pb.ModelInferRequest.InferInputTensor, params: dict[str, Any], raw: bytes | None
) -> InferInput:
    """One input: in shared memory, its raw bytes' size (the bytes follow in the tensor data),
    or its typed contents as its data (bytes, which texts.require reads as a JSON string)."""
    name = spec.name
    if PARAM_REGION in params and (raw is not None or spec.contents.ByteSize()):
        raise RequestError(400, f"input {name} has shared memory and contents both")
    if raw is not None and spec.contents.ByteSize():
        raise RequestError(400, f"input {name} has both contents and raw_input_contents")
    fields: dict[str, Any] = {"name": name, "datatype": spec.datatype, "shape": list(spec.shape)}
    placed = {k: params[k] for k in PLACEMENT if k in params}
    if raw is not None:
        fields["parameters"] = InputParameters(**placed, binary_data_size=len(raw))
    elif placed:
        fields["parameters"] = InputParameters(**placed)
    if raw is None and PARAM_REGION not in params:
        fields["data"] = list(spec.contents.bytes_contents)
    return InferInput(**fields)


def output_of(o: pb.ModelInferRequest.InferRequestedOutputTensor) -> InferOutput:
    """One output asked for; with parameters (any, as an HTTP output's `{}`) or none."""
    params = params_dict(o.parameters)
    if not params:
        return InferOutput(name=o.name)  # type: ignore[arg-type]  # checked by reading
    kept = {k: params[k] for k in OUTPUT_PARAMETERS if k in params}
    return InferOutput(name=o.name, parameters=OutputParameters(**kept))  # type: ignore[arg-type]


def set_param(p: pb.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    else:
        p.string_param = str(value)


def answer(job: InferJob, results: list[Result]) -> pb.ModelInferResponse:
    info = job.info
    answered = outputs(job, results)
    rsp = pb.ModelInferResponse(
        model_name=info.name, model_version=str(info.version), id=job.request_id
    )
    for key, value in (answered.parameters or {}).items():
        set_param(rsp.parameters[key], value)
    raw = iter(answered.blobs)
    for tensor in answered.tensors:
        out = rsp.outputs.add(
            name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
        )
        if "data" not in tensor:  # raw: its bytes, or none when shared memory holds them
            # (clients index raw_output_contents by output: one entry each, as Triton's)
            if tensor["name"] not in job.places:
                rsp.raw_output_contents.append(next(raw))
            elif job.wanted[0][1]:  # raw is every output or none (read_request)
                rsp.raw_output_contents.append(b"")
        elif tensor["datatype"] == "BYTES":
            out.contents.bytes_contents.extend([s.encode() for s in tensor["data"]])
        elif tensor["datatype"] == "INT32":  # term ids, offsets and counts
            out.contents.int_contents.extend(tensor["data"])
        else:
            out.contents.fp32_contents.extend(tensor["data"])
    return rsp
