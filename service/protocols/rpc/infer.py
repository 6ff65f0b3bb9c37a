"""ModelInfer's request and answer: protobuf messages to and from what every KServe transport
shares (service/protocols/kserve.py does the checks, so HTTP and gRPC refuse the same things alike).

A tensor travels as typed contents (`bytes_contents`, `fp32_contents`) or as raw bytes
(`raw_input_contents`, `raw_output_contents`, the binary tensor extension's layout); inputs are
taken either way. Answers are raw, as Triton gives them: tritonclient.grpc reads FP32 outputs
only from raw contents (and its typed BYTES path fails under numpy 2). A request parameter
`binary_data_output: false`, or an output's `binary_data: false`, as on HTTP, asks for typed
contents instead (for all outputs: raw is all or none, as KServe has it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols import kserve, multivector, token_classify
from ringserve.service.protocols.rpc import kserve_pb2 as pb
from ringserve.service.protocols.schemas import convert
from ringserve.service.protocols.schemas.kserve import InferParameters
from ringserve.service.protocols.shm_regions import PARAM_REGION, Placement, placement
from ringserve.service.request.errors import RequestError
from ringserve.service.request.lookup import find_model
from ringserve.service.request.options import asked_priority
from ringserve.service.request.texts import require
from ringserve.service.views import FrontView


def param_value(p: pb.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def params_dict(params: Any) -> dict[str, Any]:
    if not params:  # most calls set none: no walk over the empty map
        return {}
    return {k: param_value(v) for k, v in params.items()}


NO_PARAMETERS = InferParameters()  # what a call without parameters converts to


@dataclass(slots=True)
class InferJob:
    """One parsed ModelInfer: the core request for admission, and how to answer it."""

    info: ModelInfo  # the model it names, as found when it arrived
    ask: Ask  # what every protocol hands admission (service/engine/requests.py)
    wanted: list[tuple[str, bool]]  # (output, raw), in the order asked for
    request_id: str
    places: dict[str, Placement]  # outputs written to system shared memory (shm_regions.py)


def check_model(server: FrontView, name: str, version: str) -> ModelInfo:
    """The loaded model a call names (an empty version: the one that serves), else 404."""
    if not name:
        raise RequestError(404, "unknown model: a call must name one")
    return find_model(server, name, version or None)


def read_input(
    spec: pb.ModelInferRequest.InferInputTensor, params: dict[str, Any], raw: bytes | None
) -> list[bytes]:
    """One BYTES input's checked texts (`params`: its parameters, read), from its raw bytes or
    its typed contents."""
    name = spec.name
    if spec.datatype != "BYTES":
        raise RequestError(400, f"input {name} must have datatype BYTES, not {spec.datatype!r}")
    n = kserve.check_shape(list(spec.shape))
    where = placement(params, f"input {name}")
    if where is not None:
        if raw is not None or spec.contents.ByteSize():
            raise RequestError(400, f"input {name} has shared memory and contents both")
        texts = kserve.shm_texts(name, where)
        if len(texts) != n:
            raise RequestError(
                400, f"input {name} has shape {list(spec.shape)} but {len(texts)} texts"
            )
        return texts
    if raw is not None:
        if spec.contents.ByteSize():
            raise RequestError(400, f"input {name} has both contents and raw_input_contents")
        items = kserve.bytes_elements(memoryview(raw))
    else:
        items = list(spec.contents.bytes_contents)
    texts = [require(t, f"{name}[{i}]") for i, t in enumerate(items)]
    if len(texts) != n:
        raise RequestError(
            400, f"input {name} has shape {list(spec.shape)} but {len(texts)} elements"
        )
    return texts


# a model's outputs: (embeds, embed_only, multivector, sparse, token classifier)
Kinds = tuple[bool, bool, bool, bool, bool]
PLAIN_OUTPUTS: dict[tuple[tuple[str, ...], bool, Kinds], tuple[tuple[str, bool], ...]] = {}


def asked_outputs(
    outputs: list[dict[str, Any]], default: bool, kinds: Kinds
) -> tuple[list[tuple[str, bool]], dict[str, Any]]:
    """(name, raw) for each output to answer, in the order asked for, read as HTTP's
    (kserve.read_outputs; an output without parameters as HTTP's without any), and the document
    they were read from. `kinds`: the model's (kinds_of)."""
    doc = {"parameters": {"binary_data_output": default}, "outputs": outputs}
    asked = kserve.read_outputs(doc, *kinds)
    raw_out = all(raw for _, raw in asked)  # raw is all outputs or none (KServe)
    return [(name, raw_out) for name, _ in asked], doc


def kinds_of(m: Any) -> Kinds:
    """What decides a manifest's outputs (Kinds)."""
    return m.embeds, m.embed_only, bool(m.multivector), "sparse" in m.task, m.token_classifies


def read_outputs(
    req: pb.ModelInferRequest, default: bool, kinds: Kinds
) -> tuple[list[tuple[str, bool]], dict[str, Placement]]:
    """The outputs to answer, and those written to shared memory."""
    outputs = [
        {"name": o.name, "parameters": params_dict(o.parameters) or None} for o in req.outputs
    ]
    wanted, doc = asked_outputs(outputs, default, kinds)
    return wanted, kserve.output_places(doc)


def plain_outputs(
    key: tuple[tuple[str, ...], bool, Kinds],
) -> tuple[tuple[str, bool], ...]:
    """The outputs to answer when none has parameters (the key: their names, the binary
    default, the model's kinds_of): the same for every call that asks alike, so each such ask
    is read once and kept (bounded; a refused one is never kept)."""
    found = PLAIN_OUTPUTS.get(key)
    if found is None:
        names, default, kinds = key
        plain = [{"name": name, "parameters": None} for name in names]
        wanted, _ = asked_outputs(plain, default, kinds)
        if len(PLAIN_OUTPUTS) >= 256:
            PLAIN_OUTPUTS.clear()
        found = PLAIN_OUTPUTS[key] = tuple(wanted)
    return found


def read_request(
    server: FrontView, req: pb.ModelInferRequest, deadline_of: Callable[[int | None], int]
) -> InferJob:
    """The call's job, its deadline the call's own, else `deadline_of` the `timeout` parameter
    (Triton's, in microseconds; None when unset)."""
    info = check_model(server, req.model_name, req.model_version)
    specs = list(req.inputs)
    kserve.check_input_names([spec.name for spec in specs])
    given = [params_dict(spec.parameters) for spec in specs]  # each input's, read once
    raws = list(req.raw_input_contents)
    in_shm = sum(PARAM_REGION in p for p in given)
    if raws and len(raws) != len(specs) - in_shm:
        raise RequestError(400, f"{len(raws)} raw_input_contents for {len(specs)} inputs")
    found = {}
    for spec, given_params in zip(specs, given, strict=True):
        # raw contents in order, for the inputs not in shared memory
        in_raw = raws and PARAM_REGION not in given_params
        found[spec.name] = read_input(spec, given_params, raws.pop(0) if in_raw else None)
    texts = kserve.join_pairs(server, found)
    params = params_dict(req.parameters)
    # checked as the HTTP header's are (none given: the defaults, without converting)
    checked = convert(params, InferParameters, "parameters") if params else NO_PARAMETERS
    default = bool(params.get("binary_data_output", True))
    places: dict[str, Placement] = {}
    if not any(o.parameters for o in req.outputs):  # the usual call: read once, then kept
        plain = (tuple(o.name for o in req.outputs), default, kinds_of(info.manifest))
        wanted = list(plain_outputs(plain))
    else:
        wanted, places = read_outputs(req, default, kinds_of(info.manifest))
    level = checked.priority
    priority = asked_priority(int(level) if isinstance(level, float) else level, "priority")  # 0 up
    deadline = deadline_of(None if checked.timeout is None else int(checked.timeout))
    ask = kserve.request_ask(texts, params, wanted, info, deadline, priority, "grpc")
    return InferJob(info, ask, wanted, req.id, places)


def set_param(p: pb.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    else:
        p.string_param = str(value)


def answer(job: InferJob, results: list[Result]) -> pb.ModelInferResponse:
    info = job.info
    multi = bool(info.manifest.multivector)
    labels = multivector.KSERVE_LABELS if multi else info.labels
    encoder: Any = kserve.encoder_for(labels, info.manifest.normalize)
    if info.manifest.token_classifies:
        encoder = token_classify.encoder(info)
    joined = kserve.one_pass(job.ask.options)
    if multi:  # each pair's MaxSim, as one score
        results = multivector.kserve_results(results)
    tensors, blobs = encoder.tensors(results, job.wanted, job.places, joined)
    rsp = pb.ModelInferResponse(
        model_name=info.name, model_version=str(info.version), id=job.request_id
    )
    texts = kserve.first_pass(results, job.wanted, joined)
    if any(r.flags for r in texts):
        for key, value in kserve.long_text_parameters(texts).items():
            set_param(rsp.parameters[key], value)
    raw = iter(blobs)
    for tensor in tensors:
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
