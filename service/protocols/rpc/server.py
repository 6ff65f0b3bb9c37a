"""The gRPC port: KServe v2 `inference.GRPCInferenceService`, `grpc.health.v1.Health` and server
reflection, on grpcio's threaded server; each call is handed to the front-end's event loop,
where the dispatcher lives, and its thread waits for the answer.

Not grpc.aio on the loop, though it measured faster (docs/design.md, "gRPC"): one request whose
`:path` is not UTF-8 ends grpc.aio's server loop (grpcio 1.85: the listener closes, every later
connection is refused), and tests/system/test_fuzz_grpc.py found it. The threaded server answers it.

Every call goes through the one admission, deadline and API key the other protocols use (the
methods are rpc/servicer.py's). Errors are the HTTP statuses of protocols/kserve.py's checks,
mapped to gRPC codes once here. A drain stops the server with a
grace: gRPC closes the listener and sends GOAWAY, the calls in flight finish, and whatever
stream is left (a health Watch) is cancelled once nothing is owed.

grpcio's threaded server asks gRPC core for one call at a time: a call that reaches core while
that one request is used up (the server's poll thread not yet back for the next, a matter of
the GIL) waits in core unmatched, and core's shutdown cancels every such call (`CANCELLED`,
grpc/grpc#41785), so a --reuse-port upgrade lost one now and then. `request_slots` keeps as many
requests outstanding as the queue admits, so core matches every call as it comes and the
graceful stop serves it. A call that reaches core in the fraction of a millisecond between the
stop's start and its GOAWAY is cancelled too, and grpcio has no GOAWAY without a stop: so the
drain holds answers for HOLD_S before the stop and until it has begun. A client with one call at
a time on a connection (tritonclient's) sends nothing meanwhile, and hears the GOAWAY before its
answer; a client with many calls on one connection may still lose one sent in that instant.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from ringserve.service.engine.tenants import Tenant
from ringserve.service.protocols.auth import DENIED
from ringserve.service.protocols.http import HttpError
from ringserve.service.protocols.rpc import kserve_pb2 as pb
from ringserve.service.protocols.rpc.servicer import GrpcHost, RateLimited, Reply, Servicer
from ringserve.service.protocols.rpc.slots import request_slots

SERVICE = "inference.GRPCInferenceService"
HEALTH = "grpc.health.v1.Health"
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.FAILED_PRECONDITION,  # a repository call --model-control refuses
    409: grpc.StatusCode.FAILED_PRECONDITION,  # a load over --memory-budget
    413: grpc.StatusCode.INVALID_ARGUMENT,  # the contract's mapping: gRPC has no "too large"
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    501: grpc.StatusCode.UNIMPLEMENTED,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# With 503: the client may retry after a second (`retry-after`, as HTTP says it, and the
# standard gRPC retry pushback, which grpc's own retry policy honours).
RETRY_TRAILERS = (("retry-after", "1"), ("grpc-retry-pushback-ms", "1000"))
# Probes and metadata a kubelet or a load balancer reads without the key, as on HTTP.
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
# A drain holds answers this long before it stops the server (GrpcPort.begin_drain).
HOLD_S = 0.02
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Undecodable:
    """What the deserializer gives for bytes it cannot take: answered 400 or 413 by the call."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message


def decoder(message: Any, limit: int) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        if len(data) > limit:
            return Undecodable(413, f"request message over {limit} bytes (--max-body)")
        try:
            return message.FromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its kin: any bad bytes
            return Undecodable(400, "request is not a valid protobuf message")

    return decode


Handler = Callable[[Any, grpc.ServicerContext, Any], Coroutine[Any, Any, Any]]  # (req, ctx, tenant)
# ModelInfer's: (req, ctx, tenant, reply), run on the loop, which fills the reply when it can.
Starter = Callable[[Any, grpc.ServicerContext, Any, Reply], None]


class Health(health.HealthServicer):
    """grpc.health.v1 with one addition for the drain: end every open Watch stream (after it
    has heard NOT_SERVING), as the standard servicer never does, so that a kubelet's or a mesh's
    Watch does not keep gRPC's graceful stop from ending."""

    def end_watches(self) -> None:
        # The servicer keeps each Watch's response callback by service; None ends that stream
        # (grpc_health.v1.health's own convention for its blocking watchers).
        with self._lock:
            callbacks = [cb for cbs in self._send_response_callbacks.values() for cb in cbs]
        for send in callbacks:
            send(None)


class GrpcPort:
    """One server's gRPC listener: its start and graceful stop, its health, and the calls it has
    in flight (key check, error mapping and counting, once for every method of `calls`)."""

    def __init__(self, host: GrpcHost) -> None:
        self.host = host
        self.settings = host.settings
        self.calls = Servicer(host)  # the methods, run on the loop
        self.loop: asyncio.AbstractEventLoop | None = None  # the front-end's, set at start
        self.lock = threading.Lock()
        self.inflight = 0  # calls not yet answered (written by gRPC's threads, under the lock)
        self.health = Health()  # thread-safe; told the status from the loop
        self.serving: int | None = None  # the status the health service was last given
        self.server: grpc.Server | None = None
        self.stopped: threading.Event | None = None  # set when the graceful stop is over
        self.grace_s = 0.0  # the drain's timeout, from the stop's start
        self.answers = threading.Event()  # clear while answers wait for the stop's GOAWAY
        self.answers.set()
        # Calls ended, to be counted on the loop: one wake-up counts all that ended meanwhile.
        self.ended: collections.deque[tuple[int, Tenant | None]] = collections.deque()
        self.count_due = False

    # -- start and stop -------------------------------------------------------------------------
    async def start(self, address: str, port: int) -> None:
        s = self.settings
        self.loop = asyncio.get_running_loop()
        options = [
            # SO_REUSEPORT only when asked (grpc turns it on by default): a second server
            # without --reuse-port must fail to bind, as on the other ports.
            ("grpc.so_reuseport", 1 if s.reuse_port else 0),
            # Room above --max-body so that we answer a large request ourselves (413 mapped to
            # INVALID_ARGUMENT); past twice the limit gRPC refuses it with RESOURCE_EXHAUSTED.
            ("grpc.max_receive_message_length", 2 * s.max_body + 1024),
            ("grpc.max_concurrent_streams", s.max_queue),
        ]
        pool = ThreadPoolExecutor(s.grpc_threads, thread_name_prefix="grpc")
        server = grpc.server(pool, options=options, maximum_concurrent_rpcs=s.max_queue)
        server.add_generic_rpc_handlers([self.handlers()])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection([SERVICE, HEALTH, reflection.SERVICE_NAME], server)
        target = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        try:
            bound = server.add_insecure_port(target)
        except RuntimeError as exc:
            raise SystemExit(f"ringserve: cannot listen for gRPC on {target}: {exc}") from None
        if bound == 0:
            raise SystemExit(f"ringserve: cannot listen for gRPC on {target} (in use?)")
        server.start()
        if not request_slots(server, s.max_queue):
            self.host.log.warning("grpc_one_request", grpcio=grpc.__version__)
        self.server = server
        self.update_health()
        self.host.log.info("grpc_listening", port=bound)

    def begin_drain(self, grace_s: float) -> None:
        """Stop taking calls: gRPC closes the listener and sends GOAWAY; the calls in flight
        have `grace_s` to finish. Health says NOT_SERVING from now on."""
        if self.server is None or not self.answers.is_set() or self.stopped is not None:
            return
        self.health.enter_graceful_shutdown()  # every Watch hears NOT_SERVING first
        self.health.end_watches()  # so that only unary calls can hold the graceful stop
        self.grace_s = grace_s
        # Answers wait for the stop (HOLD_S and the stop's GOAWAY): a client with one call at a
        # time sends its next only after an answer, and a call that reached core just after the
        # stop began was cancelled there. Calls sent before the hold reach core before the stop,
        # are matched (request_slots) and served; the answers held go out after the GOAWAY, on
        # the same connection, so the client's next call goes elsewhere.
        self.answers.clear()
        assert self.loop is not None
        self.loop.call_later(HOLD_S, self.stop_now)

    def stop_now(self) -> None:
        if self.server is None or self.stopped is not None:
            return
        self.stopped = self.server.stop(self.grace_s)
        self.answers.set()

    async def close(self) -> None:
        """Nothing is owed any more: cancel what is left (health watches) and wait for the end."""
        if self.server is None:
            return
        loop = asyncio.get_running_loop()
        if not self.answers.is_set():
            self.stop_now()  # the drain ended within the hold
        until = time.monotonic() + 1.0  # after a drain timeout: the 500s on their way out
        while self.inflight and time.monotonic() < until:
            await asyncio.sleep(0.01)
        if self.stopped is not None:
            # The graceful stop ends when gRPC has no call left, counting those it took before
            # the GOAWAY but has not yet handed to a thread (`inflight` cannot see them: cutting
            # at `inflight == 0` cancelled such a call under an upgrade). Watches were ended at
            # the stop's start, so an idle channel or a probe's Watch does not hold it; gRPC
            # aborts whatever is left when the grace is over.
            await loop.run_in_executor(None, self.stopped.wait, self.grace_s + 1.0)
        done = self.server.stop(0)
        await loop.run_in_executor(None, done.wait, 5.0)

    def update_health(self) -> None:
        """Called from the loop at start, on the sweep's tick and when a stop begins."""
        status = SERVING if self.host.ready() else NOT_SERVING
        if status != self.serving:
            self.serving = status
            for name in ("", SERVICE):
                self.health.set(name, status)

    # -- calls ----------------------------------------------------------------------------------
    def handlers(self) -> grpc.GenericRpcHandler:
        c = self.calls
        methods: dict[str, tuple[Handler | Starter, Any, Any]] = {
            "ServerLive": (c.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": (c.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": (c.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": (
                c.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse
            ),
            "ModelMetadata": (
                c.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse
            ),
            "ModelInfer": (c.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
            "RepositoryIndex": (
                c.repository_index, pb.RepositoryIndexRequest, pb.RepositoryIndexResponse
            ),
            "RepositoryModelLoad": (
                c.repository_load, pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse
            ),
            "RepositoryModelUnload": (
                c.repository_unload,
                pb.RepositoryModelUnloadRequest,
                pb.RepositoryModelUnloadResponse,
            ),
        }  # fmt: skip
        limit = self.settings.max_body
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                name: grpc.unary_unary_rpc_method_handler(
                    self.wrap(name, fn),
                    request_deserializer=decoder(req, limit),
                    response_serializer=rsp.SerializeToString,
                )
                for name, (fn, req, rsp) in methods.items()
            },
        )

    def wrap(self, name: str, fn: Handler | Starter) -> Callable[[Any, grpc.ServicerContext], Any]:
        """Key check, error mapping and counting, once for every method; the method itself runs
        on the loop, and this gRPC thread waits for it. ModelInfer, the call that matters for
        throughput, is started on the loop by one call_soon_threadsafe and answers through a
        Reply; the rest run as coroutines (run_coroutine_threadsafe: a task and two futures)."""
        needs_key = name not in OPEN_METHODS
        starts = name == "ModelInfer"

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            # Owed until gRPC has sent the answer, not merely made it: the drain must not cut it.
            with self.lock:
                self.inflight += 1
            if not context.add_callback(self.answered):
                self.answered()
            code = 200
            tenant: Tenant | None = None
            try:
                if isinstance(request, Undecodable):
                    raise HttpError(request.status, request.message)
                found = self.tenant_of(context) if needs_key else True
                if found is False:
                    raise HttpError(401, DENIED)
                tenant = found if isinstance(found, Tenant) else None
                assert self.loop is not None
                if starts:
                    reply = Reply()
                    start = cast(Starter, fn)
                    self.loop.call_soon_threadsafe(start, request, context, tenant, reply)
                    return reply.wait()
                coro = cast(Handler, fn)(request, context, tenant)
                return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
            except RateLimited as exc:
                code = 429
                wait = str(exc.retry_after_s)
                context.set_trailing_metadata(
                    (("retry-after", wait), ("grpc-retry-pushback-ms", wait + "000"))
                )
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "over the key's rate")
            except HttpError as exc:
                code = exc.status
                if exc.status == 503:
                    context.set_trailing_metadata(RETRY_TRAILERS)
                context.abort(CODES.get(exc.status, grpc.StatusCode.INTERNAL), exc.message)
            finally:
                if not self.answers.is_set():
                    self.answers.wait(HOLD_S + 1.0)
                self.count_later(code, tenant)

        return call

    def count_later(self, code: int, tenant: Tenant | None) -> None:
        """Count an ended call on the loop. One wake-up counts every call that ended before
        the loop got to it (the append comes before the flag is read, and the loop clears the
        flag before it drains, so none is left behind)."""
        self.ended.append((code, tenant))
        if not self.count_due:
            self.count_due = True
            self.on_loop(self.count_ended)

    def count_ended(self) -> None:
        self.count_due = False
        ended, count = self.ended, self.host.count
        while ended:
            code, tenant = ended.popleft()
            count("grpc", code, 1, tenant)

    def answered(self) -> None:
        with self.lock:
            self.inflight -= 1

    def on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn, *args)

    def tenant_of(self, context: grpc.ServicerContext) -> Tenant | bool:
        """The key's tenant from `authorization: Bearer` metadata; True when no key is needed,
        False when the key is missing or wrong."""
        keys = self.host.keys
        if keys is None:
            return True
        for name, value in context.invocation_metadata() or ():
            if name == "authorization":
                raw = value.encode("latin-1", "replace") if isinstance(value, str) else value
                tenant = keys.bearer(raw)  # digests and compares: safe from any thread
                if tenant is not None:
                    return tenant
        self.on_loop(keys.refused, "grpc")
        return False
