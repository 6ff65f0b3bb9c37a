"""What KServe says about the server and its models, as plain documents each transport writes
in its own form (protocols/kserve.py as JSON, protocols/rpc/ as protobuf messages): the server's
metadata, a model's metadata and Triton's configuration view, Triton's statistics, and the
repository (the server's, or the fixed models of a server without one)."""

from __future__ import annotations

from typing import Any

from ringserve.service.kserve import tokens
from ringserve.service.models.info import ModelInfo
from ringserve.service.models.modelset import READY, ModelSet
from ringserve.service.request import sparse_terms
from ringserve.service.request.lookup import find_model
from ringserve.service.version import version
from ringserve.service.views import Failure, FrontView, Repository

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


def server_doc() -> dict[str, Any]:
    """The server's metadata (GET /v2, gRPC ServerMetadata)."""
    return {"name": "ringserve", "version": version(), "extensions": EXTENSIONS}


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
    neither; a token classifier its per-token outputs, kserve/tokens.py); a
    multivector model's `scores` alone, each pair's MaxSim."""
    if info.manifest.token_classifies:
        return tokens.metadata_outputs(info, kind, dims, kind == "data_type")
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
    """A sparse model's three outputs (service/request/sparse_terms.py)."""
    return sparse_terms.kserve_outputs(kind, dims, types) if "sparse" in info.manifest.task else []


def task_parameters(info: ModelInfo) -> dict[str, Any]:
    """The model's tasks (comma list: KServe parameters are scalars) and its dimension."""
    m = info.manifest
    dimension = m.dimension or int(m.multivector.get("dimension", 0))  # ColBERT's: a token's
    return {"task": ",".join(m.task), "dimension": dimension}


# -- statistics ----------------------------------------------------------------------------------
def stats_doc(server: FrontView, name: str | None, version: str | None) -> dict[str, Any]:
    """Triton's `{"model_stats": [...]}`: every ready model, a name's versions, or one."""
    if name is not None:
        find_model(server, name, version)  # 404 for a model or version that does not serve
    stats = server.inference_stats
    rows = [
        stats.doc(e.info.name, str(e.info.version), e.info.index)
        for e in server.models
        if e.state == READY
        and (name is None or e.info.name == name)
        and (version is None or str(e.info.version) == version)
    ]
    return {"model_stats": sorted(rows, key=lambda r: (r["name"], int(r["version"])))}


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
