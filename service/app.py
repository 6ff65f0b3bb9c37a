"""The front-end process's composition root: builds the parts, wires their callbacks in one
place (`App.prepare`), and starts them (`App.run`). The lifecycle that follows (signals, drain,
stop, reload, sweep) is service/lifecycle.py's.

Start: remove segments of dead servers, resolve every model and the device
(service/models/info.py), start the control socket, the supervisor and the listeners.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import uvloop
from ringserve.service.config.settings import Config, default_memory_budget
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.clients import share_of
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.engine.tenants import KeyFileError, KeyRing
from ringserve.service.front import Front, MetricsHost, RunState
from ringserve.service.lifecycle import Admin, Lifecycle
from ringserve.service.logs import EventLog
from ringserve.service.models.info import ModelInfo, resolve_models
from ringserve.service.models.repository import Repository
from ringserve.service.notify import sd_notify
from ringserve.service.ops import apidocs, metrics, tracing
from ringserve.service.ops.stats import Stats
from ringserve.service.pool.supervisor import Supervisor
from ringserve.service.ports import Ports
from ringserve.service.protocols import kserve, multivector, openapi, token_classify
from ringserve.service.protocols.auth import ApiKey, guard_http
from ringserve.service.protocols.binary import start_binary
from ringserve.service.protocols.cohere_api import cohere_routes
from ringserve.service.protocols.control import ControlProtocol, choose_control_path, start_control
from ringserve.service.protocols.handover import fetch_listeners, listen, live_peer
from ringserve.service.protocols.hosts import HostCheck
from ringserve.service.protocols.http import HttpProtocol, HttpServerState
from ringserve.service.protocols.peers import KeyFailures
from ringserve.service.protocols.routes import Router, v1_routes
from ringserve.service.protocols.sparse_api import sparse_routes
from ringserve.service.protocols.tasks import task_routes
from ringserve.service.protocols.tei_api import tei_routes
from ringserve.service.protocols.tls import Tls, TlsError, load_tls
from ringserve.shm import segment


class App:
    """Builds one server's parts and starts them; owns no behaviour of its own."""

    def __init__(self, settings: Config) -> None:
        self.settings = settings
        self.log = EventLog(settings.log_level)
        self.started = time.monotonic()
        self.keys = load_keys(settings)  # a bad key file stops the start first
        self.tls = tls_or_exit(settings)  # as does a certificate that cannot serve
        self.api_key = ApiKey(settings.api_key) if settings.api_key is not None else None
        self.api_router: Router | None = None  # the HTTP port's routes (/docs on the operator's)
        # Failed keys by client address, HTTP and binary together (--auth-failures).
        self.failures = KeyFailures(settings.auth_failures, settings.auth_window_s)

    def prepare(self) -> None:
        """Every part, built and wired here: nobody rewires another object as it is built."""
        s, log = self.settings, self.log
        removed = segment.remove_stale(keep_pid=os.getpid())
        if removed:
            log.warning("stale_segments_removed", count=len(removed), names=removed[:20])
        if s.memory_budget is None:  # read before any worker holds memory (settings.py)
            s.memory_budget = default_memory_budget()
        problems: dict[str, str] = {}
        models = resolve_models(s, log, problems)
        model = models[0]
        try:  # before the dispatcher and the pool: both size by it
            why = s.resolve_lanes(model.device, [m.runtime for m in models])
        except ValueError as exc:
            raise SystemExit(f"ringserve: {exc}") from None
        log.info("lanes", lanes=s.lane_count(), workers=s.serving_workers(), reason=why)
        self.dispatcher = dispatcher = engine_dispatcher(s, models)
        refs = [m.ref for m in models]
        self.supervisor = Supervisor(s, dispatcher, refs, model.device, log)
        self.stats = Stats(model.buckets, self.keys)
        if s.metrics:  # 0: nothing is counted per request (the overhead baseline)
            dispatcher.answers.on_result = self.stats.observe
        state = RunState(dispatcher, self.supervisor, self.started)
        spans = start_tracing(s, model.runtime)
        share = share_of(s.max_queue, s.client_queue_share)  # one client's, while others wait
        admission = Admission(
            dispatcher, state.refusal, s.request_timeout_s, self.keys, spans, share
        )
        self.front = Front(s, log, models, admission, self.stats.count, state)
        if s.metrics:
            dispatcher.answers.on_group = self.front.inference_stats.record
        self.front.repository = Repository(s, log, self.front, dispatcher, self.supervisor)
        self.front.repository.problems.update(problems)
        self.ports = Ports(s, log, self.tls)
        self.life = Lifecycle(s, log, self.front, dispatcher, self.supervisor, self.ports)
        parts = (self.stats, dispatcher, self.supervisor, self.keys, self.api_key)
        self.metrics_view = MetricsHost(s, log, *parts, self.front, self.ports)

    # -- listeners ------------------------------------------------------------------------------
    def inference_router(self) -> Router:
        """Every route of the inference port, /openapi.json last: it documents the others."""
        router = Router(self.front)
        v1_routes(router)
        task_routes(router)
        tei_routes(router)  # TEI's /info, /predict, /tokenize, ... and POST /
        cohere_routes(router)  # Cohere's v2
        multivector.routes(router)  # ColBERT's token vectors: /v1/embeddings/multi
        sparse_routes(router)  # a SPLADE model's /embed_sparse and /v1/embeddings/sparse
        token_classify.register(router)  # POST /v1/token-classify
        kserve.register(router)
        if not self.settings.operator_port:  # else they live on the operator listener
            self.add_metrics(router)
            if not self.settings.no_docs_page:
                apidocs.register(router)
        openapi.register(router, key=self.keys is not None)
        self.api_router = router
        return router

    def add_metrics(self, router: Router) -> None:
        """The operator routes, with their collector wired in: the pool hands each released
        worker's last counters to it."""
        m = metrics.register(router, self.metrics_view)
        self.supervisor.procs.on_release = m.workers.retire

    async def start_listeners(self) -> None:
        s, ports = self.settings, self.ports
        router = self.inference_router()
        route = router if self.keys is None else guard_http(self.keys, router, self.failures)
        clock = self.dispatcher.clock  # timeouts and X-Latency-Ms on the dispatcher's clock
        state = ports.http_state = HttpServerState(s, route, self.stats.count, clock)
        state.hosts = HostCheck.for_listener(s.allowed_hosts, s.host)
        state.clients = self.front.admission  # a lost connection's waiting texts dropped
        if s.access_log:
            state.access_log = metrics.access_logger(self.metrics_view)
        peer = live_peer(s.control, ports.control_path) if s.reuse_port else None
        if peer is not None:  # a live server on our ports: take its sockets, not new ones
            ports.inherited = fetch_listeners(peer, s.api_key)
        make = lambda: HttpProtocol(state)  # noqa: E731 - one line, named for the call below
        ports.listeners.append(await listen(ports, "http", make, s.host, s.port, 2048))
        if s.operator_port:
            ports.listeners.append(await self.start_operator())
        if s.binary_port:
            binary = await start_binary(ports, self.front, s.host, s.binary_port, self.failures)
            ports.listeners.append(binary)
        if s.grpc_port:  # grpcio is imported only when the port is on
            from ringserve.service.protocols.rpc.server import GrpcPort

            ports.grpc = GrpcPort(self.front)
            await ports.grpc.start(s.host, s.grpc_port, ports)
        for sock in ports.inherited.values():  # a port we no longer serve on
            sock.close()
        ports.inherited = {}

    async def start_operator(self) -> asyncio.AbstractServer:
        """The operator listener: /metrics, /v1/stats, /dashboard and /docs only, no key (bind
        it to a private address with --operator-host)."""
        s, ports = self.settings, self.ports
        router = Router(self.front)
        self.add_metrics(router)
        if not s.no_docs_page:
            api, key = self.api_router, self.keys is not None
            assert api is not None  # start_listeners builds it before the operator listener
            apidocs.register(router, lambda: openapi.render(api, key))
        openapi.register(router, key=False)
        state = ports.operator_state = HttpServerState(
            s, router, self.stats.count, self.dispatcher.clock
        )
        state.access_log = ports.http_state.access_log if ports.http_state else None
        host = s.operator_host or s.host
        state.hosts = HostCheck.for_listener(s.allowed_hosts, host)
        make = lambda: HttpProtocol(state)  # noqa: E731 - one line, named for the call below
        return await listen(ports, "operator", make, host, s.operator_port, 128)

    async def start_control(self) -> None:
        s, ports = self.settings, self.ports
        ports.control_path = choose_control_path(s.control, s.reuse_port)
        admin = Admin(self.life)

        def make() -> ControlProtocol:
            return ControlProtocol(admin, self.api_key, self.stats.count, s.max_control_line)

        ports.listeners.append(await start_control(ports.control_path, make))

    # -- start ----------------------------------------------------------------------------------
    async def run(self) -> int:
        s = self.settings
        self.prepare()
        life = self.life
        life.stop_event = asyncio.Event()
        await self.start_control()
        if not s.reuse_port:
            try:
                await self.start_listeners()  # a port in use fails the start at once
            except SystemExit:  # nothing started yet but these: closed, and the socket file
                for listener in self.ports.listeners:
                    listener.close()
                self.ports.remove_control()
                raise
        life.install_signals()
        sup = asyncio.create_task(self.supervisor.run())
        sweeper = asyncio.create_task(life.sweep())
        if s.reuse_port and await self.first_worker_ready(sup):
            await self.start_listeners()
        self.log_start()
        notify = asyncio.create_task(self.notify_ready(sup))
        code = await life.until_stopped(sup)
        for task in (sup, sweeper, notify):
            task.cancel()
        life.remove_signals()
        self.log.info("exit", code=code)
        return code

    def log_start(self) -> None:
        s, model = self.settings, self.front.model
        self.log.info(
            "start",
            pid=os.getpid(),
            host=s.host,
            port=s.port,
            operator_port=s.operator_port or None,
            tls=None if self.tls is None else "mutual" if self.tls.mutual else "on",
            api_key="set" if self.api_key else "none",  # never the key itself
            api_keys=len(self.keys.entries) if self.keys is not None else 0,
            tracing=self.front.admission.tracing is not None,
            control=self.ports.control_path,
            reuse_port=s.reuse_port,
            model=model.name,
            fingerprint=model.manifest.fingerprint,
            models=[m.name for m in self.front.models.infos()],
            memory_budget=s.memory_budget,
            device=model.device,
            runtime=model.runtime,
            precision=s.for_model(model.name).precision,
            workers=self.supervisor.target,
            spares=s.spares,
        )

    async def notify_ready(self, sup: asyncio.Task[Any]) -> None:
        """Tell systemd (Type=notify) we serve: listening, and a worker ready."""
        if await self.first_worker_ready(sup):
            sd_notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving")

    async def first_worker_ready(self, sup: asyncio.Task[Any]) -> bool:
        """With --reuse-port the kernel shares new connections among every listener on the port,
        so a server still loading its model must not listen yet: bind once a worker is ready."""
        stop = self.life.stop_event
        assert stop is not None
        while self.supervisor.ready_count() == 0:
            if sup.done() or stop.is_set() or self.supervisor.fatal:
                return False
            await asyncio.sleep(0.02)
        return True


def engine_dispatcher(settings: Config, models: list[ModelInfo]) -> Dispatcher:
    """The dispatcher, tuned for the device, each model opened on it; a text's cost is cut
    where its tokens are: at the longest max_length, or its windows' worth."""
    s = settings
    windows = s.max_windows if s.long_text == "window" else 1
    dispatcher = Dispatcher(
        s.max_queue,
        max_queue_ms=s.max_queue_ms,
        hold_cost=s.hold_cost(models[0].device),
        max_tokens=max(m.manifest.max_length for m in models) * windows,
        bulk_wait_ms=s.bulk_max_wait_ms,
    )
    for m in models:
        dispatcher.table.open(m.index, m.name, s.max_queue, m.priority, m.shape, m.warm_options)
    return dispatcher


def start_tracing(settings: Config, runtime: str) -> tracing.Tracing | None:
    """OpenTelemetry, only when asked for: the SDK is imported by Tracing(), never otherwise."""
    if not tracing.wanted(settings.otlp_endpoint):
        return None
    try:
        return tracing.Tracing(settings.otlp_endpoint, runtime)
    except ValueError as exc:
        raise SystemExit(f"ringserve: {exc}") from None
    except ImportError as exc:
        raise SystemExit(
            f"ringserve: tracing needs opentelemetry-sdk and its OTLP exporter ({exc.name} "
            "is missing): pip install 'ringserve[tracing]'"
        ) from None


def load_keys(settings: Config) -> KeyRing | None:
    """--api-key (one unnamed key) and --api-keys FILE together; None when neither is set. A
    bad line stops the start with its line number (never the key)."""
    if settings.api_key is None and settings.api_keys is None:
        return None
    try:
        return KeyRing(settings.api_key, settings.api_keys)
    except KeyFileError as exc:
        raise SystemExit(f"ringserve: --api-keys: {exc}") from None


def tls_or_exit(settings: Config) -> Tls | None:
    """--tls-cert's contexts; a file that cannot serve is exit 2 (a bad setting, as a config
    file's), named with its option, before anything starts."""
    try:
        return load_tls(settings)
    except TlsError as exc:
        print(f"ringserve: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def serve(settings: Config) -> int:
    return uvloop.run(App(settings).run())
