"""Triton's extensions of the gRPC service: ModelConfig, ModelStatistics and the system
shared-memory calls, answered from the documents and the region registry HTTP answers from
(service/kserve/documents.py and regions.py), so both protocols say the same."""

from __future__ import annotations

from typing import Any

from ringserve.service.engine.tenants import Tenant
from ringserve.service.kserve import documents
from ringserve.service.kserve.regions import NO_CUDA, REGIONS
from ringserve.service.protocols.rpc import infer
from ringserve.service.protocols.rpc import kserve_pb2 as pb
from ringserve.service.request.errors import RequestError
from ringserve.service.views import FrontView


def config_message(doc: dict[str, Any]) -> pb.ModelConfig:
    """documents.config_doc's configuration as the protobuf message."""
    config = pb.ModelConfig(
        name=doc["name"],
        platform=doc["platform"],
        backend=doc["backend"],
        max_batch_size=doc["max_batch_size"],
    )
    for spec in doc["input"]:
        config.input.add(
            name=spec["name"],
            data_type=pb.DataType.Value(spec["data_type"]),
            dims=spec["dims"],
            optional=spec.get("optional", False),
        )
    for spec in doc["output"]:
        out = config.output.add(
            name=spec["name"], data_type=pb.DataType.Value(spec["data_type"]), dims=spec["dims"]
        )
        if "reshape" in spec:
            out.reshape.shape.extend(spec["reshape"]["shape"])
    config.dynamic_batching.SetInParent()
    for key, value in doc["parameters"].items():
        config.parameters[key].string_value = value["string_value"]
    return config


def statistics_message(doc: dict[str, Any]) -> pb.ModelStatisticsResponse:
    rsp = pb.ModelStatisticsResponse()
    for row in doc["model_stats"]:
        stats = rsp.model_stats.add(
            name=row["name"],
            version=row["version"],
            last_inference=row["last_inference"],
            inference_count=row["inference_count"],
            execution_count=row["execution_count"],
        )
        for phase, d in row["inference_stats"].items():
            getattr(stats.inference_stats, phase).CopyFrom(
                pb.StatisticDuration(count=d["count"], ns=d["ns"])
            )
    return rsp


class TritonMethods:
    """The Servicer's Triton calls: (request, context, tenant) -> answer, as its others."""

    host: FrontView

    async def model_config(
        self, req: pb.ModelConfigRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.ModelConfigResponse:
        info = infer.check_model(self.host, req.name, req.version)
        return pb.ModelConfigResponse(config=config_message(documents.config_doc(self.host, info)))

    async def model_statistics(
        self, req: pb.ModelStatisticsRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.ModelStatisticsResponse:
        """All models (no name), a name's versions, or one version."""
        doc = documents.stats_doc(self.host, req.name or None, req.version or None)
        return statistics_message(doc)

    async def shm_status(
        self, req: pb.SystemSharedMemoryStatusRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.SystemSharedMemoryStatusResponse:
        rsp = pb.SystemSharedMemoryStatusResponse()
        for row in REGIONS.status(req.name or None):
            rsp.regions[row["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**row)
            )
        return rsp

    async def shm_register(
        self, req: pb.SystemSharedMemoryRegisterRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.SystemSharedMemoryRegisterResponse:
        REGIONS.register(req.name, req.key, req.offset, req.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def shm_unregister(
        self,
        req: pb.SystemSharedMemoryUnregisterRequest,
        context: Any,
        tenant: Tenant | None = None,
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        """One region by name; all of them when the name is empty (tritonclient's default)."""
        REGIONS.unregister(req.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_status(
        self, req: pb.CudaSharedMemoryStatusRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.CudaSharedMemoryStatusResponse:
        if req.name:
            raise RequestError(400, f"no CUDA shared-memory region {req.name!r} is registered")
        return pb.CudaSharedMemoryStatusResponse()

    async def cuda_register(
        self, req: pb.CudaSharedMemoryRegisterRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.CudaSharedMemoryRegisterResponse:
        raise RequestError(400, NO_CUDA)

    async def cuda_unregister(
        self, req: pb.CudaSharedMemoryUnregisterRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # none is registered: nothing to do
