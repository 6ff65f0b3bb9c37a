"""KServe v2 / Open Inference Protocol over HTTP, as Triton serves it, so tritonclient just works.

Every loaded model by name, and by version under `/versions/{v}` (models/modelset.py finds it;
the repository extension lists, loads and unloads them through `front.repository`). Each takes
input `text` (BYTES, shape [N] or [N, 1]) and the
optional `text_pair` (as many texts, for models that classify a pair), outputs
`scores` (FP32 [N, C]) and `label` (BYTES [N]), and `embedding` (FP32 [N, D]) for a model that
embeds (a sparse model: `sparse_indices`, `sparse_values`, `sparse_lengths`, sparse_terms.py):
those named, or all when none is (one forward pass answers them all). Tensors travel as
JSON or through the binary tensor data extension, in both directions. An infer call's N texts
are one dispatcher group: one admission, one callback, one answer.
"""

from __future__ import annotations

import asyncio
import json
import struct
import zlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import msgspec
import numpy as np
from ringserve.service.engine.requests import Ask, Options, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.models.modelset import READY, ModelSet
from ringserve.service.ops.inference_stats import InferenceStats
from ringserve.service.protocols import (
    admit,
    multivector,
    shm_regions,
    sparse_terms,
    token_classify,
)
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router
from ringserve.service.protocols.schemas import S, decode_bytes
from ringserve.service.protocols.schemas.kserve import (
    MAX_TIMEOUT_US,
    Infer,
    RepositoryIndex,
    RepositoryLoad,
    RepositoryUnload,
)
from ringserve.service.protocols.shm_regions import REGIONS, Placement, placement
from ringserve.service.protocols.tasks import vectors
from ringserve.service.request import prompts
from ringserve.service.request.errors import RequestError
from ringserve.service.request.lookup import find_model
from ringserve.service.request.options import as_integer, asked_priority, long_text_options
from ringserve.service.request.texts import require
from ringserve.service.version import version
from ringserve.service.views import Failure, FrontView, Repository
from ringserve.shm import layout as L

VERSION = "1"  # a model's version without numbered version directories
EXTENSIONS = [
    "binary_tensor_data",
    "model_repository",
    "model_configuration",
    "statistics",
    "system_shared_memory",
]
# Triton's platform names for the runtime that serves (ModelInfo.runtime: onnx, openvino or
# torch); Triton names its OpenVINO backend "openvino"
PLATFORMS = {"onnx": "onnxruntime_onnx", "torch": "pytorch_libtorch", "openvino": "openvino"}
OUTPUTS = ("scores", "label")  # a classifier's outputs
EMBEDDING = "embedding"  # an embed model's output, FP32 [N, D], asked for by name
HEADER_LENGTH = b"inference-header-content-length"
_U32 = struct.Struct("<I")

KHandler = Callable[[FrontView, HttpProtocol, Exchange, dict[str, str]], None]


def register(router: Router) -> None:
    server = router.server
    router.add("GET", "/v2", guard(server, server_metadata))
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        router.add("GET", base, guard(server, model_metadata))
        router.add("GET", base + "/ready", guard(server, model_ready))
        router.add("GET", base + "/config", guard(server, model_config))
        router.add("POST", base + "/infer", guard(server, infer, inference=True))
        router.add("GET", base + "/stats", guard(server, model_stats))
    router.add("GET", "/v2/models/stats", guard(server, model_stats))
    shm_regions.register_routes(router)
    router.add("POST", "/v2/repository/index", guard(server, repository_index))
    router.add("POST", "/v2/repository/models/{model}/load", guard(server, repository_load))
    router.add("POST", "/v2/repository/models/{model}/unload", guard(server, repository_unload))


def guard(
    server: FrontView, handler: KHandler, inference: bool = False
) -> Callable[[HttpProtocol, Exchange, dict[str, str]], None]:
    """Answer a handler's RequestError here, with the latency header every inference answer has."""

    def run(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        try:
            handler(server, conn, ex, params)
        except RequestError as exc:
            extra = (
                [latency_header(conn, ex)] if inference else None
            )  # every inference answer has it
            conn.respond_error(ex, exc.status, exc.message, extra)

    return run


def check_model(server: FrontView, params: dict[str, str]) -> ModelInfo:
    """The loaded model a path names (and its version, under /versions/{v}), else 404."""
    version = params.get("version")
    return find_model(
        server, unquote(params["model"]), None if version is None else unquote(version)
    )


def respond_json(conn: HttpProtocol, ex: Exchange, doc: Any, status: int = 200) -> None:
    conn.respond(ex, status, json.dumps(doc).encode())


# -- metadata and health --------------------------------------------------------------------------
def server_metadata(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    doc = {"name": "ringserve", "version": version(), "extensions": EXTENSIONS}
    respond_json(conn, ex, doc)


def model_metadata(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    respond_json(conn, ex, metadata_doc(server, check_model(server, p)))


def versions(models: ModelSet, name: str) -> list[str]:
    """The loaded versions of a model's name, lowest first."""
    found = sorted(e.info.version for e in models if e.info.name == name and e.state == READY)
    return [str(v) for v in found]


def metadata_doc(server: FrontView, info: ModelInfo) -> dict[str, Any]:
    """The model's KServe metadata, as HTTP and gRPC (service/protocols/rpc) answer it."""
    return {
        "name": info.name,
        "versions": versions(server.models, info.name) or [str(info.version)],
        "platform": platform_of(info),
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
            {"name": "text_pair", "datatype": "BYTES", "shape": [-1, 1]}
            | ({} if info.manifest.multivector else {"optional": True}),
        ][: 1 if info.manifest.token_classifies else 2],  # a token classifier takes no pair
        "outputs": [
            *class_outputs(info, "datatype", ("FP32", "BYTES"), "shape"),
            *embedding_output(info, "datatype", "FP32", "shape"),
            *sparse_outputs(info, "datatype", "shape", sparse_terms.DATATYPES),
        ],
        "parameters": task_parameters(info) | {"activation": info.manifest.activation},
    }


def platform_of(info: ModelInfo) -> str:
    return PLATFORMS.get(info.runtime, info.runtime)


def model_config(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    """Triton's model configuration view, which tools such as perf_analyzer read."""
    respond_json(conn, ex, config_doc(server, check_model(server, p)))


def config_doc(server: FrontView, info: ModelInfo) -> dict[str, Any]:
    """Triton's configuration of a batching model: the batch is the first dimension, left out
    of `dims` (metadata's shapes are [-1, *dims]); a text is one element ([1]), so that
    perf_analyzer can make inputs without being told a shape. Label's [1] is answered [N]
    (Triton's `reshape: {shape: []}`)."""
    return {
        "name": info.name,
        "platform": platform_of(info),
        "backend": platform_of(info).split("_")[0],
        "max_batch_size": server.settings.max_texts,
        "input": [
            {"name": "text", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "text_pair", "data_type": "TYPE_STRING", "dims": [1]}
            | ({} if info.manifest.multivector else {"optional": True}),
        ][: 1 if info.manifest.token_classifies else 2],
        "output": config_outputs(info),
        "dynamic_batching": {},  # the workers batch what arrives together (docs/design.md)
        "parameters": {k: {"string_value": str(v)} for k, v in task_parameters(info).items()}
        | {
            "labels": {"string_value": ",".join(info.labels)},
            "activation": {"string_value": info.manifest.activation},
        },
    }


def config_outputs(info: ModelInfo) -> list[dict[str, Any]]:
    """The outputs of the configuration: metadata's shapes without the batch dimension."""
    out = [
        *class_outputs(info, "data_type", ("TYPE_FP32", "TYPE_STRING"), "dims"),
        *embedding_output(info, "data_type", "TYPE_FP32", "dims"),
    ]
    if info.manifest.token_classifies:  # already without the batch
        return out
    for spec in out:
        spec["dims"] = spec["dims"][1:] or [1]
        if spec["name"] == "label":
            spec["reshape"] = {"shape": []}
    # a sparse model's outputs are flat, of any length: no batch dimension to leave out
    return out + sparse_outputs(info, "data_type", "dims", sparse_terms.CONFIG_TYPES)


def class_outputs(
    info: ModelInfo, kind: str, types: tuple[str, str], dims: str
) -> list[dict[str, Any]]:
    """`scores` and `label`, for a model that classifies (an embed-only or a sparse one gives
    neither; a token classifier its per-token outputs, protocols/token_classify.py); a
    multivector model's `scores` alone, each pair's MaxSim."""
    if info.manifest.token_classifies:
        return token_classify.metadata_outputs(info, kind, dims, kind == "data_type")
    if info.manifest.embed_only or "sparse" in info.manifest.task:
        return []
    if info.manifest.multivector:
        return [{"name": "scores", kind: types[0], dims: [-1, 1]}]
    return [
        {"name": "scores", kind: types[0], dims: [-1, len(info.labels)]},
        {"name": "label", kind: types[1], dims: [-1]},
    ]


def embedding_output(info: ModelInfo, kind: str, fp32: str, dims: str) -> list[dict[str, Any]]:
    m = info.manifest
    return [{"name": EMBEDDING, kind: fp32, dims: [-1, m.dimension]}] if m.embeds else []


def sparse_outputs(info: ModelInfo, kind: str, dims: str, types: dict[str, str]) -> list[Any]:
    """A sparse model's three outputs (service/protocols/sparse_terms.py)."""
    return sparse_terms.kserve_outputs(kind, dims, types) if "sparse" in info.manifest.task else []


def task_parameters(info: ModelInfo) -> dict[str, Any]:
    """The model's tasks (comma list: KServe parameters are scalars) and its dimension."""
    m = info.manifest
    dimension = m.dimension or int(m.multivector.get("dimension", 0))  # ColBERT's: a token's
    return {"task": ",".join(m.task), "dimension": dimension}


def model_ready(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    name = check_model(server, p).name
    if server.ready():
        respond_json(conn, ex, {"name": name, "ready": True})
    else:
        conn.respond(
            ex,
            503,
            json.dumps({"name": name, "ready": False}).encode(),
            extra=[(b"retry-after", b"1")],
        )


# -- statistics ----------------------------------------------------------------------------------
def stats_doc(server: FrontView, name: str | None, version: str | None) -> dict[str, Any]:
    """Triton's `{"model_stats": [...]}`: every ready model, a name's versions, or one."""
    if name is not None:
        find_model(server, name, version)  # 404 for a model or version that does not serve
    stats: InferenceStats = getattr(server, "inference_stats", None) or InferenceStats()
    rows = [
        stats.doc(e.info.name, str(e.info.version), e.info.index)
        for e in server.models
        if e.state == READY
        and (name is None or e.info.name == name)
        and (version is None or str(e.info.version) == version)
    ]
    return {"model_stats": sorted(rows, key=lambda r: (r["name"], int(r["version"])))}


def model_stats(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    name, version = p.get("model"), p.get("version")
    doc = stats_doc(
        server,
        None if name is None else unquote(name),
        None if version is None else unquote(version),
    )
    respond_json(conn, ex, doc)


# -- infer: request -------------------------------------------------------------------------------
def read_body(server: FrontView, ex: Exchange) -> bytes:
    """The request body, inflated when the client compressed it (tritonclient can)."""
    body = b"".join(ex.body)
    encoding = ex.headers.get(b"content-encoding", b"identity").strip().lower()
    if encoding == b"identity":
        return body
    if encoding not in (b"gzip", b"deflate"):
        raise RequestError(
            400, f"unsupported Content-Encoding {encoding.decode(errors='replace')!r}"
        )
    limit = server.settings.max_body
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == b"gzip" else zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)  # bounded: a small bomb stays small
    except zlib.error:
        raise RequestError(400, f"body is not valid {encoding.decode()} data") from None
    if len(data) > limit:
        raise RequestError(413, f"inflated body over {limit} bytes")
    if not inflater.eof:
        raise RequestError(400, f"truncated {encoding.decode()} body")
    return data


def split_body(server: FrontView, ex: Exchange) -> tuple[dict[str, Any], memoryview]:
    """The JSON inference header and the binary tensor data after it."""
    body = read_body(server, ex)
    raw = ex.headers.get(HEADER_LENGTH)
    size = len(body)
    if raw is not None:
        try:
            size = int(raw)
        except ValueError:
            raise RequestError(400, "Inference-Header-Content-Length must be an integer") from None
        if not 0 <= size <= len(body):
            raise RequestError(400, "Inference-Header-Content-Length is outside the body")
    view = memoryview(body)
    header = decode_bytes(view[:size], Infer, "inference header")
    # checked whole by its Struct; read as plain values by the code gRPC shares (rpc/infer.py)
    doc: dict[str, Any] = msgspec.to_builtins(header)
    return doc, view[size:]


def as_dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(400, f"{where} must be a JSON object")
    return value


def as_size(value: Any, where: str) -> int:
    size = as_integer(value)
    if size is None or size < 0:
        raise RequestError(400, f"{where} must be a non-negative integer")
    return size


def check_shape(shape: Any) -> int:
    """The number of texts that `shape` ([N] or [N, 1]) holds."""
    if not isinstance(shape, list) or not 1 <= len(shape) <= 2:
        raise RequestError(400, "input text must have shape [N] or [N, 1]")
    dims = [as_size(d, "input text shape") for d in shape]
    if len(dims) == 2 and dims[1] != 1:
        raise RequestError(400, f"input text must have shape [N] or [N, 1], got {dims}")
    return dims[0]


def bytes_elements(blob: memoryview) -> list[bytes]:
    """BYTES tensor data: each element a u32 little-endian length, then its bytes."""
    out: list[bytes] = []
    pos, end = 0, len(blob)
    while pos < end:
        if end - pos < 4:
            raise RequestError(400, "BYTES tensor data ends inside an element's length")
        (n,) = _U32.unpack_from(blob, pos)
        pos += 4
        if n > end - pos:
            raise RequestError(400, "BYTES tensor element runs past its binary data")
        out.append(blob[pos : pos + n].tobytes())
        pos += n
    return out


def json_elements(data: list[Any]) -> list[Any]:
    """Row-major data, flat or nested one level ([N, 1] written as [["a"], ["b"]])."""
    rows = sum(isinstance(d, list) for d in data)
    if rows and rows != len(data):
        raise RequestError(400, "input data mixes rows and texts")
    if rows:
        return [x for row in data for x in row]
    return data


INPUTS = ("text", "text_pair")


def read_input(spec: dict[str, Any], blob: memoryview, pos: int) -> tuple[list[bytes], int]:
    """One BYTES input's texts, and where the next input's binary data starts."""
    name = spec["name"]
    if spec.get("datatype") != "BYTES":
        raise RequestError(
            400, f"input {name} must have datatype BYTES, not {spec.get('datatype')!r}"
        )
    n = check_shape(spec.get("shape"))
    params = as_dict(spec.get("parameters"), "input parameters")
    where = placement(params, f"input {name}")
    if where is not None:
        if "data" in spec or "binary_data_size" in params:
            raise RequestError(400, f"input {name} has shared memory and data both")
        texts = shm_texts(name, where)
    elif "binary_data_size" in params:
        size = as_size(params["binary_data_size"], "binary_data_size")
        if size > len(blob) - pos:
            raise RequestError(400, f"binary_data_size {size} but {len(blob) - pos} bytes left")
        part = blob[pos : pos + size]
        texts = [require(t, f"{name}[{i}]") for i, t in enumerate(bytes_elements(part))]
        pos += size
    elif "data" in spec:
        items = json_elements(spec["data"])
        texts = [require(t, f"{name}[{i}]") for i, t in enumerate(items)]
    else:
        raise RequestError(400, f"input {name} has neither data nor binary_data_size")
    if len(texts) != n:
        raise RequestError(400, f"input {name} has shape {spec['shape']} but {len(texts)} elements")
    return texts, pos


def shm_texts(name: str, where: Placement) -> list[bytes]:
    """A BYTES input's texts from a registered shared-memory region (shm_regions.py)."""
    items = bytes_elements(memoryview(REGIONS.read(where)))
    return [require(t, f"{name}[{i}]") for i, t in enumerate(items)]


def read_texts(server: FrontView, doc: dict[str, Any], blob: memoryview) -> list[bytes]:
    """The request's texts; with the optional input `text_pair`, each text joined to its pair."""
    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise RequestError(400, 'inputs must be a list of one input, "text", and maybe "text_pair"')
    check_input_names([spec.get("name") if isinstance(spec, dict) else None for spec in inputs])
    found: dict[str, list[bytes]] = {}
    pos = 0
    for spec in inputs:
        found[spec["name"]], pos = read_input(spec, blob, pos)
    if pos != len(blob):
        raise RequestError(400, "binary data given, but no input names it (binary_data_size)")
    return join_pairs(server, found)


def check_input_names(names: list[Any]) -> None:
    """`text`, and maybe `text_pair`, each once (HTTP and gRPC alike)."""
    if not 1 <= len(names) <= 2:
        raise RequestError(400, 'inputs must be a list of one input, "text", and maybe "text_pair"')
    for name in names:
        if name not in INPUTS:
            raise RequestError(400, f'unknown input {name!r}: the model takes "text", "text_pair"')
    if "text" not in names or len(set(names)) != len(names):
        raise RequestError(400, 'inputs must be a list of one input, "text", and maybe "text_pair"')


def join_pairs(server: FrontView, found: dict[str, list[bytes]]) -> list[bytes]:
    """The payloads of checked inputs: each text, joined to its pair when `text_pair` is given."""
    texts = found["text"]
    if not 1 <= len(texts) <= server.settings.max_texts:
        raise RequestError(400, f"input text must hold 1 to {server.settings.max_texts} texts")
    pairs = found.get("text_pair")
    if pairs is None:
        return texts
    if len(pairs) != len(texts):
        raise RequestError(400, f"input text_pair has {len(pairs)} texts, text has {len(texts)}")
    return [t + L.PAIR_SEPARATOR + p for t, p in zip(texts, pairs, strict=True)]


def passes(wanted: list[tuple[str, bool]]) -> tuple[bool, bool]:
    """(classify, embed): which answers the outputs asked for need. Both: one pass answers
    each text's scores and vector (OPT_BOTH), unless a prompt makes the two inputs differ."""
    classify = embed = False
    for name, _ in wanted:  # a loop, not sets: called a few times for every request
        if name == EMBEDDING:
            embed = True
        else:
            classify = True
    return classify, embed


def request_ask(
    texts: list[bytes],
    params: dict[str, Any],
    wanted: list[tuple[str, bool]],
    info: ModelInfo,
    deadline: int,
    priority: int | None,
    protocol: str,
) -> Ask:
    """The core request of a KServe call (HTTP or gRPC): the payloads and their options byte
    (the request's long-text options), and the task they count under: the texts to classify;
    for output `embedding` alone, the texts with the ask for a vector (layout OPT_EMBED); for
    both, the texts once with the ask for both (OPT_BOTH: one forward pass), or, when the
    model's prompt goes before a text to embed, the texts to classify then the prompted texts
    with OPT_EMBED (two passes, one group). A token classifier's: protocols/token_classify.py."""
    if info.manifest.token_classifies:
        return token_classify.kserve_ask(texts, params, info, deadline, priority, protocol)
    opts = long_text_options(params, "parameters.")
    if info.manifest.multivector:  # a rerank: each pair's MaxSim
        return multivector.kserve_ask(texts, opts, info, deadline, priority, protocol)
    model = info.index
    if "sparse" in info.manifest.task:  # one answer a text: its terms, whatever outputs are asked
        return Ask(texts, opts, "sparse", model, deadline, priority, protocol)
    classify, embed = passes(wanted)
    if not embed:
        return Ask(texts, opts, "classify", model, deadline, priority, protocol)
    # the worker answers each text's vector, the prompt before it (prompts.py)
    vectors = prompts.with_prompt(info.manifest, params.get("prompt_name"), texts)
    if not classify:
        return Ask(vectors, opts | L.OPT_EMBED, "embed", model, deadline, priority, protocol)
    if vectors is texts:  # no prompt: the forward pass that scores a text also embeds it
        return Ask(texts, opts | L.OPT_BOTH, "classify", model, deadline, priority, protocol)
    both = [opts] * len(texts) + [opts | L.OPT_EMBED] * len(vectors)
    return Ask(texts + vectors, both, "classify", model, deadline, priority, protocol)


def one_pass(options: Options) -> bool:
    """Whether request_ask asked for each text's scores and vector in one answer."""
    return isinstance(options, int) and bool(options & L.OPT_BOTH)


def first_pass(
    results: list[Result], wanted: list[tuple[str, bool]], joined: bool = False
) -> list[Result]:
    """One result a text (a group of two passes has two)."""
    scored, embedded = split_results(results, wanted, joined)
    return scored or embedded


def split_results(
    results: list[Result], wanted: list[tuple[str, bool]], joined: bool = False
) -> tuple[list[Result], list[Result]]:
    """(scores' results, vectors' results) of a group made by request_ask. One pass's answers
    (`joined`, OPT_BOTH: each holds C scores, then the vector) are both, read in place: the
    scores and the vectors are cut from them where they are written (OutputEncoder.tensor)."""
    classify, embed = passes(wanted)
    if classify and embed:
        if joined:
            return results, results
        n = len(results) // 2
        return results[:n], results[n:]
    return (results, []) if classify else ([], results)


def read_outputs(
    doc: dict[str, Any],
    embeds: bool = False,
    embed_only: bool = False,
    multi: bool = False,
    sparse: bool = False,
    tokens: bool = False,
) -> list[tuple[str, bool]]:
    """(name, binary) for each output to answer, in the order asked for: any of the model's
    outputs; when none is named, all of them in metadata's order (Triton's rule): `scores`,
    `label`, then `embedding` for a model that has it; one forward pass answers them all. A
    multivector model (`multi`) has `scores` alone; a sparse one its terms (`sparse`); a token
    classifier its per-token outputs (`tokens`: protocols/token_classify.py OUTPUTS)."""
    params = as_dict(doc.get("parameters"), "parameters")
    default = params.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise RequestError(400, "parameters.binary_data_output must be true or false")
    asked = doc.get("outputs")
    known: tuple[str, ...] = (
        (EMBEDDING,) if embed_only else (*OUTPUTS, EMBEDDING) if embeds else OUTPUTS
    )
    if multi:
        known = OUTPUTS[:1]
    if sparse:
        known = sparse_terms.OUTPUTS
    if tokens:
        known = token_classify.OUTPUTS
    if not asked:
        return [(name, default) for name in known]
    if not isinstance(asked, list):
        raise RequestError(400, "outputs must be a list")
    wanted: list[tuple[str, bool]] = []
    for spec in asked:
        if not isinstance(spec, dict) or spec.get("name") not in known:
            name = spec.get("name") if isinstance(spec, dict) else spec
            raise RequestError(400, f"unknown output {name!r}: the model gives {', '.join(known)}")
        if any(spec["name"] == w for w, _ in wanted):
            raise RequestError(400, f"output {spec['name']!r} asked for twice")
        if spec.get("parameters") is None:  # the usual output: no place, the default encoding
            wanted.append((spec["name"], default))
            continue
        out_params = as_dict(spec.get("parameters"), "output parameters")
        if out_params.get("classification") is not None:
            raise RequestError(400, "classification outputs are not supported")
        placement(out_params, f"output {spec['name']}")  # checked here, used by output_places
        binary = out_params.get("binary_data", default)
        if not isinstance(binary, bool):
            raise RequestError(400, "output parameters.binary_data must be true or false")
        wanted.append((spec["name"], binary))
    return wanted


def output_places(doc: dict[str, Any]) -> dict[str, Placement]:
    """The outputs a request (checked by read_outputs) has written into shared memory."""
    found: dict[str, Placement] = {}
    for spec in doc.get("outputs") or []:
        if spec.get("parameters") is None:  # no parameters: no place
            continue
        where = placement(as_dict(spec.get("parameters"), "output parameters"), spec["name"])
        if where is not None:
            found[spec["name"]] = where
    return found


def request_deadline(server: FrontView, ex: Exchange, doc: dict[str, Any]) -> int | None:
    """Triton's `timeout` parameter (microseconds), unless X-Request-Timeout-Ms says otherwise;
    checked either way, so a bad one is refused whatever the header says."""
    raw = as_dict(doc.get("parameters"), "parameters").get("timeout")
    if raw is None:
        return None  # Admission.submit takes the header's or the default deadline
    timeout_us = as_integer(raw)
    if timeout_us is None or not 0 < timeout_us <= MAX_TIMEOUT_US:
        raise RequestError(
            400, f"parameters.timeout must be an integer from 1 to {MAX_TIMEOUT_US} (microseconds)"
        )
    if b"x-request-timeout-ms" in ex.headers:
        return None
    return ex.done_ns + timeout_us * 1000


# -- infer: answer --------------------------------------------------------------------------------
class OutputEncoder:
    """Turns one group's results into the outputs asked for; label encodings made once."""

    def __init__(self, labels: list[str], normalize: bool = False) -> None:
        self.labels = labels
        self.normalize = normalize  # embeddings: as the model's own pipeline does
        encoded = [label.encode() for label in labels]
        self.label_blobs = [_U32.pack(len(b)) + b for b in encoded]

    def tensors(
        self,
        results: list[Result],
        wanted: list[tuple[str, bool]],
        places: dict[str, Placement] | None = None,
        joined: bool = False,
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        """The outputs' tensors (JSON data, or binary with its bytes in the blobs, in order);
        an output with a place in `places` is written there, answered without data. `joined`:
        one pass's answers, each its C scores then its vector (split_results)."""
        scored, embedded = split_results(results, wanted, joined)
        tensors: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for name, binary in wanted:
            where = places.get(name) if places else None
            part = embedded if name == EMBEDDING else scored
            tensor, data = self.tensor(name, part, binary or where is not None, joined)
            if where is not None:  # the raw bytes, as the binary extension has them; the
                REGIONS.write(where, data)  # tensor says no more (as Triton's: clients read
                # parameters as the binary extension's)
            elif binary:
                tensor["parameters"] = {"binary_data_size": len(data)}
                blobs.append(data)
            else:
                tensor["data"] = data
            tensors.append(tensor)
        return tensors, blobs

    def tensor(
        self, name: str, results: list[Result], binary: bool, joined: bool = False
    ) -> tuple[dict[str, Any], Any]:
        """One output: its tensor's head, and its data (raw bytes when `binary`). `joined`: each
        answer holds C scores then the vector, cut here (the scores' columns or the rest)."""
        n, c = len(results), len(self.labels)
        if name in sparse_terms.OUTPUTS:
            return sparse_terms.kserve_tensor(name, results, binary)
        if name == EMBEDDING:
            vecs = vectors(results, self.normalize, skip=c if joined else 0)
            head = {"name": name, "datatype": "FP32", "shape": list(vecs.shape)}
            return head, vecs.tobytes() if binary else vecs.ravel().tolist()
        if name == "scores":
            head = {"name": name, "datatype": "FP32", "shape": [n, c]}
            rows = [r.scores[:c] if joined else r.scores for r in results]  # type: ignore[index]
            # one text's row as a [1, C] view: np.stack's own checks cost more than the copy
            stacked = np.asarray(rows[0])[None] if n == 1 else np.stack(rows)  # type: ignore[arg-type]
            scores = stacked.astype("<f4", copy=False)
            return head, scores.tobytes() if binary else scores.ravel().tolist()
        head = {"name": name, "datatype": "BYTES", "shape": [n]}
        if binary:
            return head, b"".join([self.label_blobs[r.label_id] for r in results])
        return head, [self.labels[r.label_id] for r in results]


_encoders: dict[tuple[str, ...], OutputEncoder] = {}


def encoder_for(labels: list[str], normalize: bool = False) -> OutputEncoder:
    key = (*labels, str(normalize))
    encoder = _encoders.get(key)
    if encoder is None:
        if len(_encoders) >= L.MAX_MODELS:  # bounded: reloads with new labels come and go
            _encoders.clear()
        encoder = _encoders[key] = OutputEncoder(labels, normalize)
    return encoder


def long_text_parameters(results: list[Result]) -> dict[str, Any]:
    """Response parameters when a text was cut or windowed. KServe parameters are scalars, so
    the per-text counts are comma lists, one entry a text in input order."""
    params: dict[str, Any] = {
        "truncated": any(r.flags & L.RSP_TRUNCATED for r in results),
        "tokens": ",".join(str(r.tokens) for r in results),
    }
    if any(r.flags & L.RSP_WINDOWED for r in results):
        params["windows"] = ",".join(str(r.windows) for r in results)
    return params


def infer(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    info = check_model(server, params)
    name, version = info.name, str(info.version)
    doc, blob = split_body(server, ex)
    request_id = doc.get("id")
    texts = read_texts(server, doc, blob)
    m = info.manifest
    multi = bool(m.multivector)
    wanted = read_outputs(
        doc, m.embeds, m.embed_only, multi, "sparse" in m.task, m.token_classifies
    )
    parameters = as_dict(doc.get("parameters"), "parameters")
    deadline = request_deadline(server, ex, doc) or 0  # 0: the header's, or the default
    asked = parameters.get("priority")
    if isinstance(asked, float):  # a level: an integer, as its Struct reads it
        asked = int(asked)
    priority = asked_priority(asked, "parameters.priority")  # never above the key's
    ask = request_ask(texts, parameters, wanted, info, deadline, priority, "kserve")
    encoder: Any = encoder_for(multivector.KSERVE_LABELS if multi else info.labels, m.normalize)
    if m.token_classifies:
        encoder = token_classify.encoder(info)

    places = output_places(doc)
    joined = one_pass(ask.options)

    def done(results: list[Result]) -> None:
        if multi:  # each pair's MaxSim, as one score
            results = multivector.kserve_results(results)
        try:
            tensors, blobs = encoder.tensors(results, wanted, places, joined)
        except RequestError as exc:  # a region unregistered meanwhile, or too small
            conn.respond_error(ex, exc.status, exc.message, [latency_header(conn, ex)])
            return
        answer: dict[str, Any] = {"model_name": name, "model_version": version}
        if request_id is not None:
            answer["id"] = request_id
        texts = first_pass(results, wanted, joined)
        if any(r.flags for r in texts):
            answer["parameters"] = long_text_parameters(texts)
        answer["outputs"] = tensors
        head = msgspec.json.encode(answer)  # 0.3 us, against 4.4 for json.dumps
        extra = [latency_header(conn, ex)]
        if blobs:
            extra.append((HEADER_LENGTH, b"%d" % len(head)))
            body = b"".join([head, *blobs])
            conn.respond(ex, 200, body, content_type=b"application/octet-stream", extra=extra)
        else:
            conn.respond(ex, 200, head, extra=extra)

    admit.submit(server.admission, conn, ex, ask, done)


# -- the repository extension ---------------------------------------------------------------------
class FixedModels:
    """The repository of a server that has none (front.repository unset): the models it
    started with, listed; it loads and unloads nothing, as --model-control none refuses."""

    REFUSAL = (400, "models load and unload on request only with --model-control explicit")

    def __init__(self, models: ModelSet) -> None:
        self.models = models

    def index(self) -> list[dict[str, Any]]:
        keys = ("name", "version", "state", "reason")
        return [{k: row[k] for k in keys} for row in self.models.listing()]

    async def load(self, name: str, version: str | None = None) -> Failure:
        return self.REFUSAL

    async def unload(self, name: str) -> Failure:
        return self.REFUSAL


def repository_of(server: FrontView) -> Repository:
    repository = server.repository
    return repository if repository is not None else FixedModels(server.models)


_pending: set[asyncio.Task[None]] = set()  # repository calls in progress (kept from the GC)


def repository_index(
    server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]
) -> None:
    """POST /v2/repository/index: tritonclient sends an empty body; `{"ready": true}` keeps
    the models that serve."""
    ready = optional_body(ex, RepositoryIndex).ready
    rows = repository_of(server).index()
    respond_json(conn, ex, [r for r in rows if r.get("state") == READY] if ready else rows)


def optional_body(ex: Exchange, kind: type[S]) -> S:
    """A body tritonclient may send empty (taken as `{}`)."""
    body = b"".join(ex.body)
    return decode_bytes(body if body.strip() else b"{}", kind)


def repository_load(server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]) -> None:
    """POST /v2/repository/models/{name}/load; parameter `version` names one (else the
    highest); Triton's `config` and `file:` overrides are not taken."""
    load = optional_body(ex, RepositoryLoad)
    given = optional_body(ex, dict[str, Any]).get("parameters") or {}  # every key, to refuse
    if "config" in given or any(k.startswith("file:") for k in given):
        raise RequestError(400, "load parameters config and file: are not supported")
    asked = load.parameters.version if load.parameters else None
    version = None if asked is None else str(asked)
    run_repository(conn, ex, repository_of(server).load(unquote(p["model"]), version))


def repository_unload(
    server: FrontView, conn: HttpProtocol, ex: Exchange, p: dict[str, str]
) -> None:
    """POST /v2/repository/models/{name}/unload (`unload_dependents` has nothing to do here)."""
    optional_body(ex, RepositoryUnload)  # unload_dependents: nothing depends on a model here
    run_repository(conn, ex, repository_of(server).unload(unquote(p["model"])))


def run_repository(conn: HttpProtocol, ex: Exchange, call: Awaitable[Failure]) -> None:
    """Answer a load or unload when it ends: 200 `{}`, or its error."""

    async def run() -> None:
        try:
            failed = await call
        except Exception as exc:  # noqa: BLE001 - answered, never left hanging
            failed = 500, f"repository call failed: {exc}"
        if failed is None:
            conn.respond(ex, 200, b"{}")
        else:
            conn.respond_error(ex, failed[0], failed[1])

    task = asyncio.get_running_loop().create_task(run())
    _pending.add(task)
    task.add_done_callback(_pending.discard)
