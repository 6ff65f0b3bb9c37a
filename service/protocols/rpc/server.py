"""The gRPC port: KServe v2 `inference.GRPCInferenceService`, `grpc.health.v1.Health` and server
reflection, served on the front-end's own event loop by rpc/http2/ HTTP/2 (no thread, no
grpcio server): a call's method runs where the dispatcher lives, and a ModelInfer's answer is
written by the dispatcher's callback (docs/design.md, "gRPC", for why and what it measured).

Every call goes through the one admission, deadline and API key the other protocols use (the
methods are rpc/servicer.py's). Errors are RequestError's statuses (service/request/errors.py),
mapped to gRPC codes once here. A drain closes the listener, says NOT_SERVING, ends every health
Watch, and sends each connection GOAWAY (http2.Connection.begin_drain): the calls in flight finish,
calls the client sent after the GOAWAY go to another server, and each connection closes when its
last answer is out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ringserve.service.engine.requests import Group
from ringserve.service.engine.tenants import Tenant
from ringserve.service.protocols import handover
from ringserve.service.protocols.auth import DENIED
from ringserve.service.protocols.rpc import http2 as h2
from ringserve.service.protocols.rpc import kserve_pb2 as pb
from ringserve.service.protocols.rpc.health import Health, end_ok, keep_one
from ringserve.service.protocols.rpc.http2 import Connection, Stream
from ringserve.service.protocols.rpc.http2.grpc import STREAM_WINDOW
from ringserve.service.protocols.rpc.limits import ConnectionLimits
from ringserve.service.protocols.rpc.servicer import RateLimited, Servicer
from ringserve.service.request.errors import RequestError
from ringserve.service.views import FrontView

SERVICE = "inference.GRPCInferenceService"
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
CODES = {
    400: h2.INVALID_ARGUMENT,
    401: h2.UNAUTHENTICATED,
    404: h2.NOT_FOUND,
    405: h2.FAILED_PRECONDITION,  # a repository call --model-control refuses
    409: h2.FAILED_PRECONDITION,  # a load over --memory-budget
    413: h2.INVALID_ARGUMENT,  # the contract's mapping: gRPC has no "too large"
    429: h2.RESOURCE_EXHAUSTED,
    503: h2.UNAVAILABLE,
    501: h2.UNIMPLEMENTED,
    504: h2.DEADLINE_EXCEEDED,
}
# With 503: the client may retry after a second (`retry-after`, as HTTP says it, and the
# standard gRPC retry pushback, which grpc's own retry policy honours).
RETRY_TRAILERS = (("retry-after", "1"), ("grpc-retry-pushback-ms", "1000"))
# Probes and metadata a kubelet or a load balancer reads without the key, as on HTTP.
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
PING_WAIT_S = 1.0  # a drain's final GOAWAY goes out by then, PING answered or not

Handler = Callable[[Any, Stream, Any], Coroutine[Any, Any, Any]]  # (req, call, tenant)


def open_paths(methods: dict[bytes, Any]) -> frozenset[bytes]:
    """The paths open without the key, as on HTTP: the probes, health and reflection."""
    ours = f"/{SERVICE}/".encode()
    return frozenset(
        p for p in methods if not p.startswith(ours) or p[len(ours) :].decode() in OPEN_METHODS
    )


class Answer:
    """A ModelInfer's answer, given on the loop by the dispatcher's callback (or its refusal).
    Once its texts are admitted, a call its client cancels (RST_STREAM, or the connection
    lost) drops those no worker has taken yet (Admission.cancel)."""

    __slots__ = ("group", "port", "stream", "tenant")

    def __init__(self, port: GrpcPort, stream: Stream, tenant: Tenant | None) -> None:
        self.port, self.stream, self.tenant = port, stream, tenant
        self.group: Group | None = None

    def admitted(self, group: Group) -> None:
        self.group = group
        self.stream.on_cancel = self.cancel

    def cancel(self, stream: Stream) -> None:
        if self.group is not None:
            self.port.host.admission.cancel(self.group)

    def give(self, value: Any) -> None:
        self.stream.reply(value.SerializeToString())
        self.port.ended(200, self.tenant)

    def fail(self, error: BaseException) -> None:
        self.port.refuse(self.stream, error, self.tenant)


class GrpcPort:
    """One server's gRPC listener and connections: its start and drain, its health, and the
    calls it has in flight (key check, error mapping and counting, once for every method)."""

    def __init__(self, host: FrontView) -> None:
        self.host = host
        self.settings = s = host.settings
        self.calls = Servicer(host)
        # Room above --max-body so that we answer a large request ourselves (413 mapped to
        # INVALID_ARGUMENT); past twice the limit the stream ends RESOURCE_EXHAUSTED.
        self.limit = 2 * s.max_body + 1024
        self.max_streams = s.max_queue
        # What one connection may hold (--grpc-buffer): never less than one largest message
        # beside a stream's starting window.
        self.stream_window = STREAM_WINDOW
        self.budget = max(s.grpc_buffer, self.limit + 5 + STREAM_WINDOW)
        self.listener: asyncio.AbstractServer | None = None
        self.limits = ConnectionLimits(s)  # the cap and the sweep's timeouts
        self.connections = self.limits.connections
        self.inflight = 0  # calls not yet answered
        self.health = Health((SERVICE, HEALTH, REFLECTION))
        self.draining = False
        self.methods = self.method_table()
        self.open_paths = open_paths(self.methods)

    # -- start and stop -------------------------------------------------------------------------
    async def start(self, address: str, port: int, ports: handover.Listeners | None = None) -> None:
        """Listen (on the socket the server beside us hands over, under --reuse-port)."""
        loop = asyncio.get_running_loop()

        def make() -> Connection:
            return Connection(self, time.monotonic_ns)

        try:
            if ports is not None:
                self.listener = await handover.listen(ports, "grpc", make, address, port, 2048)
            else:
                self.listener = await loop.create_server(
                    make, address, port, reuse_port=self.settings.reuse_port or None, backlog=2048
                )
        except OSError as exc:
            raise SystemExit(
                f"ringserve: cannot listen for gRPC on {address}:{port}: {exc}"
            ) from None
        self.update_health()
        sockets = getattr(self.listener, "sockets", None) or ()
        bound = sockets[0].getsockname()[1] if sockets else port
        self.host.log.info("grpc_listening", port=bound)

    def begin_drain(self, grace_s: float = 0.0) -> None:
        """Stop taking calls: close the listener, say NOT_SERVING (and end every Watch after
        it), and send each connection GOAWAY; the calls in flight finish."""
        if self.draining:
            return
        self.draining = True
        if self.listener is not None:
            self.listener.close()
        self.update_health()
        self.health.end_watches()
        for conn in list(self.connections):
            conn.begin_drain()
        asyncio.get_running_loop().call_later(PING_WAIT_S, self.final_goaways)

    def final_goaways(self) -> None:
        for conn in list(self.connections):
            conn.end.final_goaway()

    async def close(self) -> None:
        """Nothing is owed any more: each connection closes once its last answer is out (a
        second at most), then whatever is left is closed."""
        self.begin_drain()
        self.final_goaways()
        until = time.monotonic() + 1.0
        while self.connections and time.monotonic() < until:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.end.abort()

    def update_health(self) -> None:
        """Called at start, on the sweep's tick, when a stop begins and at the drain."""
        self.health.update(self.host.ready() and not self.draining)

    # -- connections (h2.Port) ------------------------------------------------------------------
    def opened(self, conn: Connection) -> None:
        if not self.limits.admit(conn, time.monotonic_ns()):
            return
        if self.draining:  # accepted before the listener closed
            conn.begin_drain()

    def broken(self, exc: Exception) -> None:
        self.host.log.warning("grpc_connection_failed", error=repr(exc))

    def closed(self, conn: Connection) -> None:
        self.limits.forget(conn)

    def begin(self, stream: Stream) -> None:
        """A new call, its headers in: find its method, check its key on the headers, before
        any of its message is read, and take its messages."""
        found = self.methods.get(stream.path)
        if found is None:
            stream.finish(h2.UNIMPLEMENTED, f"unknown method {stream.path.decode('latin-1')}")
            return
        if self.host.keys is not None and stream.path not in self.open_paths:
            tenant = self.tenant_of(stream)
            if tenant is False:
                stream.finish(h2.UNAUTHENTICATED, DENIED)
                self.host.count("grpc", 401, 1, None)
                return
            stream.tenant = tenant
        stream.on_message, stream.on_end = found

    def method_table(self) -> dict[bytes, tuple[Any, Any]]:
        c = self.calls
        unary: dict[str, tuple[Any, Any]] = {
            "ServerLive": (c.server_live, pb.ServerLiveRequest),
            "ServerReady": (c.server_ready, pb.ServerReadyRequest),
            "ModelReady": (c.model_ready, pb.ModelReadyRequest),
            "ServerMetadata": (c.server_metadata, pb.ServerMetadataRequest),
            "ModelMetadata": (c.model_metadata, pb.ModelMetadataRequest),
            "ModelInfer": (c.model_infer, pb.ModelInferRequest),
            "RepositoryIndex": (c.repository_index, pb.RepositoryIndexRequest),
            "RepositoryModelLoad": (c.repository_load, pb.RepositoryModelLoadRequest),
            "RepositoryModelUnload": (c.repository_unload, pb.RepositoryModelUnloadRequest),
            "ModelConfig": (c.model_config, pb.ModelConfigRequest),
            "ModelStatistics": (c.model_statistics, pb.ModelStatisticsRequest),
            "SystemSharedMemoryStatus": (c.shm_status, pb.SystemSharedMemoryStatusRequest),
            "SystemSharedMemoryRegister": (c.shm_register, pb.SystemSharedMemoryRegisterRequest),
            "SystemSharedMemoryUnregister": (
                c.shm_unregister,
                pb.SystemSharedMemoryUnregisterRequest,
            ),
            "CudaSharedMemoryStatus": (c.cuda_status, pb.CudaSharedMemoryStatusRequest),
            "CudaSharedMemoryRegister": (c.cuda_register, pb.CudaSharedMemoryRegisterRequest),
            "CudaSharedMemoryUnregister": (c.cuda_unregister, pb.CudaSharedMemoryUnregisterRequest),
        }
        table: dict[bytes, tuple[Any, Any]] = {}
        for name, (fn, message) in unary.items():
            table[f"/{SERVICE}/{name}".encode()] = (keep_one, self.unary(name, fn, message))
        table[f"/{HEALTH}/Check".encode()] = (keep_one, self.health.check)
        table[f"/{HEALTH}/Watch".encode()] = (keep_one, self.health.watch)
        table[f"/{REFLECTION}/ServerReflectionInfo".encode()] = (self.health.reflect, end_ok)
        return table

    # -- unary calls ----------------------------------------------------------------------------
    def unary(self, name: str, fn: Any, message: Any) -> Callable[[Stream], None]:
        """At the client's half-close, with its one message (its key checked at `begin`): the
        method (ModelInfer started at once and answered by the dispatcher's callback, the rest
        as a task), errors mapped and counted, once for every method."""
        starts = name == "ModelInfer"
        max_body = self.settings.max_body

        def call(stream: Stream) -> None:
            data, stream.request = stream.request, None
            if data is None:
                stream.finish(h2.INVALID_ARGUMENT, "a unary call takes one request message")
                return
            self.inflight += 1
            tenant = stream.tenant if isinstance(stream.tenant, Tenant) else None
            try:
                if len(data) > max_body:
                    raise RequestError(413, f"request message over {max_body} bytes (--max-body)")
                try:
                    request = message.FromString(data)
                except Exception:  # noqa: BLE001 - protobuf's DecodeError and its kin
                    raise RequestError(400, "request is not a valid protobuf message") from None
                if starts:
                    fn(request, stream, tenant, Answer(self, stream, tenant))
                    return
                task = asyncio.ensure_future(fn(request, stream, tenant))
                task.add_done_callback(lambda t: self.task_done(t, stream, tenant))
            except Exception as exc:  # noqa: BLE001 - RequestError, or a bug: answered either way
                self.refuse(stream, exc, tenant)

        return call

    def task_done(self, task: asyncio.Task[Any], stream: Stream, tenant: Tenant | None) -> None:
        error = None if task.cancelled() else task.exception()
        if task.cancelled() or error is not None:
            self.refuse(stream, error or asyncio.CancelledError(), tenant)
            return
        stream.reply(task.result().SerializeToString())
        self.ended(200, tenant)

    def refuse(self, stream: Stream, exc: BaseException, tenant: Tenant | None) -> None:
        if isinstance(exc, RateLimited):
            code = 429
            wait = str(exc.retry_after_s)
            trailers = (("retry-after", wait), ("grpc-retry-pushback-ms", wait + "000"))
            stream.finish(h2.RESOURCE_EXHAUSTED, "over the key's rate", trailers)
        elif isinstance(exc, RequestError):
            code = exc.status
            extra = RETRY_TRAILERS if code == 503 else ()
            stream.finish(CODES.get(code, h2.INTERNAL), exc.message, extra)
        else:
            code = 500
            self.host.log.warning("grpc_call_failed", error=repr(exc))
            stream.finish(h2.UNKNOWN, "internal error")
        self.ended(code, tenant)

    def ended(self, code: int, tenant: Tenant | None) -> None:
        self.inflight -= 1
        self.host.count("grpc", code, 1, tenant)

    def tenant_of(self, stream: Stream) -> Tenant | bool:
        """The key's tenant from `authorization: Bearer` metadata; True when no key is needed,
        False when the key is missing or wrong."""
        keys = self.host.keys
        if keys is None:
            return True
        for name, value in stream.metadata:
            if name == "authorization":
                tenant = keys.bearer(value.encode("latin-1", "replace"))
                if tenant is not None:
                    return tenant
        keys.refused("grpc")
        return False
