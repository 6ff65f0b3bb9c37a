"""The KServe v2 methods of the gRPC port, as coroutines on the front-end's loop: health and
metadata, and ModelInfer through the one admission, deadline and queue the other protocols use
(a ModelInfer is one dispatcher group, as a KServe HTTP infer is). Errors are raised as
RequestError (service/request/errors.py), with the statuses every transport's table maps from;
rpc/server.py maps them to gRPC codes once.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Protocol

from ringserve.service.engine.admission import failure, first_failure
from ringserve.service.engine.dispatcher import Result
from ringserve.service.engine.requests import Group
from ringserve.service.engine.tenants import PRIORITY_NAMES, Tenant
from ringserve.service.kserve import documents
from ringserve.service.kserve.reading import InferJob
from ringserve.service.models.modelset import READY
from ringserve.service.protocols.rpc import infer
from ringserve.service.protocols.rpc import kserve_pb2 as pb
from ringserve.service.protocols.rpc.triton import TritonMethods
from ringserve.service.request.errors import RequestError
from ringserve.service.version import version
from ringserve.service.views import FrontView


class Context(Protocol):
    """What a method reads of its call (h2.Stream is one): metadata and the deadline."""

    def invocation_metadata(self) -> list[tuple[str, str]]: ...
    def time_remaining(self) -> float | None: ...


class Reply(Protocol):
    """Where ModelInfer's answer goes, once: the answer or the error; and, once its texts are
    admitted, their group (a call its client cancels drops those still queued)."""

    def give(self, value: Any) -> None: ...
    def fail(self, error: BaseException) -> None: ...
    def admitted(self, group: Group) -> None: ...


class RateLimited(Exception):
    """A call over its key's rate: RESOURCE_EXHAUSTED, with the wait in the trailers."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(retry_after_s)
        self.retry_after_s = retry_after_s


class Servicer(TritonMethods):
    """inference.GRPCInferenceService's methods: (request, context, tenant) -> answer (the
    Triton extensions' in rpc/triton.py)."""

    def __init__(self, host: FrontView) -> None:
        self.host = host
        self.settings = host.settings

    async def server_live(
        self, req: Any, context: Any, tenant: Tenant | None = None
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(
        self, req: Any, context: Any, tenant: Tenant | None = None
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.host.ready())

    async def model_ready(
        self, req: pb.ModelReadyRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.ModelReadyResponse:
        infer.check_model(self.host, req.name, req.version)
        return pb.ModelReadyResponse(ready=self.host.ready())

    async def server_metadata(
        self, req: Any, context: Any, tenant: Tenant | None = None
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name="ringserve", version=version(), extensions=documents.EXTENSIONS
        )

    async def model_metadata(
        self, req: pb.ModelMetadataRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.ModelMetadataResponse:
        doc = documents.metadata_doc(self.host, infer.check_model(self.host, req.name, req.version))
        rsp = pb.ModelMetadataResponse(
            name=doc["name"], versions=doc["versions"], platform=doc["platform"]
        )
        for spec in doc["inputs"]:
            rsp.inputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        for spec in doc["outputs"]:
            rsp.outputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        return rsp

    # -- the repository extension (kserve/documents.py's repository_of, as HTTP) ---------------
    async def repository_index(
        self, req: pb.RepositoryIndexRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.RepositoryIndexResponse:
        rsp = pb.RepositoryIndexResponse()
        for row in documents.repository_of(self.host).index():
            if req.ready and row.get("state") != READY:
                continue
            rsp.models.add(
                name=str(row.get("name", "")),
                version=str(row.get("version", "")),
                state=str(row.get("state", "")),
                reason=str(row.get("reason", "")),
            )
        return rsp

    async def repository_load(
        self, req: pb.RepositoryModelLoadRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.RepositoryModelLoadResponse:
        """Parameter `version` (string or int64) names a version; Triton's `config` and
        `file:` overrides are not taken."""
        params = req.parameters
        if "config" in params or any(k.startswith("file:") for k in params):
            raise RequestError(400, "load parameters config and file: are not supported")
        version: str | None = None
        if "version" in params:
            p = params["version"]
            kind = p.WhichOneof("parameter_choice")
            if kind not in ("string_param", "int64_param"):
                raise RequestError(400, "parameters.version must be a string or an integer")
            version = str(getattr(p, kind))
        failed = await documents.repository_of(self.host).load(req.model_name, version)
        if failed is not None:
            raise RequestError(*failed)
        return pb.RepositoryModelLoadResponse()

    async def repository_unload(
        self, req: pb.RepositoryModelUnloadRequest, context: Any, tenant: Tenant | None = None
    ) -> pb.RepositoryModelUnloadResponse:
        failed = await documents.repository_of(self.host).unload(req.model_name)
        if failed is not None:
            raise RequestError(*failed)
        return pb.RepositoryModelUnloadResponse()

    def model_infer(
        self,
        req: pb.ModelInferRequest,
        context: Context,
        tenant: Tenant | None,
        reply: Reply,
    ) -> None:
        """On the loop, called by the call's gRPC thread, which waits on `reply`. Admission as
        for HTTP: the key's priority (a request may lower it), the trace, then Admission.submit:
        the key's rate (429), then the one queue (503). No task and no future: the dispatcher's
        callback fills the reply, so a call costs the loop one wake-up (docs/design.md, "gRPC")."""
        trace = self.start_trace(context, time.monotonic_ns())
        try:
            job = infer.read_request(self.host, req, partial(self.deadline_ns, context))
            if trace is not None:
                level = self.host.admission.level(tenant, job.ask.priority, job.ask.model)
                trace.root.set_attributes(
                    {"ringserve.task": job.ask.task, "ringserve.priority": PRIORITY_NAMES[level]}
                )
                if tenant is not None:
                    trace.root.set_attribute("ringserve.tenant", tenant.name)
            self.submit(job, tenant, trace, reply)
        except (RateLimited, RequestError) as exc:
            self.refused(exc, trace, reply)
        except Exception as exc:  # noqa: BLE001 - a bug: the waiting thread answers it (UNKNOWN)
            reply.fail(exc)

    def submit(self, job: InferJob, tenant: Tenant | None, trace: Any, reply: Reply) -> None:
        def done(results: list[Result]) -> None:
            failed = first_failure(results)
            try:
                if failed is not None:
                    raise RequestError(*failure(failed))
                answer = infer.answer(job, results)
            except RequestError as exc:
                self.refused(exc, trace, reply)
                return
            except Exception as exc:  # noqa: BLE001 - as in model_infer
                reply.fail(exc)
                return
            if trace is not None:
                trace.written(200, time.monotonic_ns())
            reply.give(answer)

        admission = self.host.admission
        refusal = admission.submit(job.ask, done, tenant, trace)
        if refusal is None:
            if admission.last_group is not None:
                reply.admitted(admission.last_group)
            return
        if refusal.code == 429:
            raise RateLimited(refusal.retry_after_s)
        raise RequestError(refusal.code, refusal.message)

    def refused(self, exc: RateLimited | RequestError, trace: Any, reply: Reply) -> None:
        if trace is not None:
            trace.written(exc.status if isinstance(exc, RequestError) else 429, time.monotonic_ns())
        reply.fail(exc)

    def start_trace(self, context: Context, received: int) -> Any:
        """The call's span when tracing is on, continuing a `traceparent` in its metadata."""
        tracing = self.host.admission.tracing
        if tracing is None:
            return None
        meta = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        parent, state = meta.get("traceparent"), meta.get("tracestate")
        return tracing.start(
            "grpc ModelInfer",
            "grpc",
            received,
            parent.encode("latin-1", "replace") if parent else None,
            state.encode("latin-1", "replace") if state else None,
            {"rpc.system": "grpc", "rpc.method": "ModelInfer"},
        )

    def deadline_ns(self, context: Context, timeout_us: int | None) -> int:
        """The client's gRPC deadline, else Triton's `timeout` parameter, else the default."""
        now = time.monotonic_ns()
        left = context.time_remaining()
        if left is not None and left > 86_400:  # grpcio's threaded server: "no deadline" is huge
            left = None
        if left is not None:
            if left <= 0:
                raise RequestError(504, "request deadline passed")
            return now + int(left * 1e9)
        if timeout_us is not None:
            return now + timeout_us * 1000
        return now + int(self.settings.request_timeout_s * 1e9)
