"""The front-end process: wires listeners, dispatcher and supervisor, and runs the lifecycle.

Start: remove segments of dead servers, resolve the model and device, start the supervisor and
the listeners. Stop (SIGTERM, SIGINT or `drain`): stop accepting, answer what is in flight within
the drain timeout, stop workers TERM then KILL, unlink segments, remove the control socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringserve.factory.build import default_in_child
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.dispatcher import Dispatcher, Group, Result
from ringserve.service.engine.tenants import KeyFileError, KeyRing, Tenant
from ringserve.service.logs import EventLog
from ringserve.service.notify import sd_notify
from ringserve.service.ops import metrics
from ringserve.service.ops.stats import Stats
from ringserve.service.pool.supervisor import Supervisor
from ringserve.service.protocols import openapi
from ringserve.service.protocols.auth import ApiKey, guard_http
from ringserve.service.protocols.binary import BinaryServerState
from ringserve.service.protocols.control import ControlProtocol, choose_control_path, start_control
from ringserve.service.protocols.handover import fetch_listeners, listen, listening_fds, live_peer
from ringserve.service.protocols.http import HttpProtocol, HttpServerState
from ringserve.service.protocols.routes import Router, v1_routes
from ringserve.service.protocols.tasks import task_routes
from ringserve.service.settings import Config
from ringserve.shm import segment
from ringserve.workers import nvml
from ringserve.workers.artifact import ArtifactError, Manifest, default_cache_dir, load_manifest
from ringserve.workers.batcher import REPORT_GRID, length_grid, pad_grid
from ringserve.workers.onnx_model import choose_runtime
from ringserve.workers.spec import FAKE_GPU
from ringserve.workers.testhooks import HOOKS

if TYPE_CHECKING:
    from ringserve.service.protocols.rpc.server import GrpcPort

SWEEP_S = 0.25
STOP_GRACE_S = 5.0  # workers' time to exit on SIGTERM before SIGKILL
HURRY_GRACE_S = 0.5  # the same after a second SIGINT/SIGTERM


def resolve_device(wanted: str, log: EventLog) -> str:
    """`auto` means CUDA when NVML and torch both see a GPU; otherwise the CPU, said once.
    `fake-gpu` (tests only, with RINGSERVE_TEST_FAKE_GPU=1) runs the CUDA code path on the CPU."""
    if wanted == "cpu":
        return "cpu"
    if wanted == FAKE_GPU and HOOKS.fake_gpu:
        log.warning("device_fake_gpu", reason="test-only: the GPU code path runs on the CPU")
        return wanted
    if wanted != "auto" and not re.fullmatch(r"cuda(:\d+)?", wanted):
        raise SystemExit(f"ringserve: unknown --device {wanted!r} (cpu, cuda, cuda:K or auto)")
    # NVML numbers GPUs in PCI bus order; so must CUDA, here and in every worker (cuda:K is
    # then the K-th GPU as nvidia-smi lists it, whatever CUDA_DEVICE_ORDER the user set).
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    missing = nvml.cuda_unavailable_reason()
    if wanted == "auto":
        if missing is None:
            return "cuda"
        log.info("device_auto", device="cpu", reason=missing)
        return "cpu"
    if missing is not None:
        raise SystemExit(f"ringserve: --device {wanted} asked for, but {missing}")
    count = nvml.cuda_device_count()
    if ":" in wanted and int(wanted.split(":")[1]) >= count:
        raise SystemExit(f"ringserve: --device {wanted}: only {count} CUDA device(s) here")
    return wanted


class Server:
    def __init__(self, settings: Config) -> None:
        self.settings = settings
        self.log = EventLog(settings.log_level)
        self.draining = False  # listeners closed: answering what is owed, then exiting
        self.stopping = False  # SIGTERM seen: readiness answers 503 (the shutdown delay)
        self.hurry = False  # a second SIGINT/SIGTERM: stop at once, still cleaning up
        self.reloading: asyncio.Future[str | None] | None = None  # one reload at a time
        self.tasks: set[asyncio.Task[Any]] = set()  # started by signal handlers, kept alive
        self.stop_reason: str | None = None
        self.stop_event: asyncio.Event | None = None
        self.started = time.monotonic()
        self.dispatcher = Dispatcher(settings.max_queue)
        self.dispatcher.on_result = self.on_result
        self.admission = Admission(self.dispatcher, settings, self.refusal)
        # (protocol, code, tenant): tenant is "" without --api-keys, and for answers to no key.
        self.requests_total: dict[tuple[str, int, str], int] = {}
        self.manifest: Manifest
        self.model_dir = ""
        self.device = "cpu"
        self.labels: list[str] = []
        self.buckets: tuple[int, ...] = ()
        self.pad_grid: tuple[int, ...] = ()  # empty: each CPU batch padded to its own longest
        self.runtime = "torch"  # resolved in prepare(): torch or onnx
        self.graph: dict[str, Any] = {}  # resolved in prepare(): the fp32 graph and why
        self.listeners: list[asyncio.AbstractServer] = []
        self.control_path = settings.control  # PATH, or PATH.<pid> beside a live server
        self.bound: dict[str, asyncio.AbstractServer] = {}  # listeners by name, to hand over
        self.inherited: dict[str, socket.socket] = {}  # handed over by the server beside us
        self.http_state: HttpServerState | None = None
        self.operator_state: HttpServerState | None = None  # --operator-port
        # The control socket's key (--api-key); the keys of inference, with their tenants.
        self.api_key = ApiKey(settings.api_key) if settings.api_key is not None else None
        self.keys = load_keys(settings)
        self.admission.keys = self.keys
        self.binary_state: BinaryServerState | None = None  # when the binary port is on
        self.stats: Stats | None = None  # unless --metrics 0
        self.grpc: GrpcPort | None = None  # when the gRPC port is on

    # -- set-up ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        removed = segment.remove_stale(keep_pid=os.getpid())
        if removed:
            self.log.warning("stale_segments_removed", count=len(removed), names=removed[:20])
        try:
            model_dir = self.settings.model or str(default_in_child(self.settings.cache_dir))
            self.manifest = load_manifest(model_dir)
        except ArtifactError as exc:
            raise SystemExit(f"ringserve: {exc}") from None
        self.model_dir = model_dir
        self.labels = list(self.manifest.labels)
        max_len = self.manifest.max_length
        self.device = resolve_device(self.settings.device, self.log)
        on_gpu = self.device != "cpu"
        self.pad_grid = pad_grid(self.settings.buckets, on_gpu, max_len)
        # Latency is reported per length class: the padding grid's, or a fixed one without it.
        self.buckets = length_grid(self.pad_grid or REPORT_GRID, max_len)
        self.choose_runtime(on_gpu)
        self.dispatcher.max_queue_ms = self.settings.max_queue_ms
        self.dispatcher.hold_cost = self.settings.hold_cost(self.device)
        self.dispatcher.waiting.max_wait_ns = int(self.settings.bulk_max_wait_ms * 1e6)
        self.start_tracing()
        # A text's cost is cut where its tokens are: at max_length, or its windows' worth.
        windows = self.settings.max_windows if self.settings.long_text == "window" else 1
        self.dispatcher.max_tokens = max_len * windows
        self.supervisor = Supervisor(
            self.settings, self.dispatcher, self.model_dir, self.device, self.log
        )

    def start_tracing(self) -> None:
        """OpenTelemetry, only when asked for: the SDK is imported here, never otherwise."""
        from ringserve.service.ops import tracing

        if not tracing.wanted(self.settings.otlp_endpoint):
            return
        try:
            self.admission.tracing = tracing.Tracing(self.settings.otlp_endpoint, self.runtime)
        except ValueError as exc:
            raise SystemExit(f"ringserve: {exc}") from None
        except ImportError as exc:
            raise SystemExit(
                f"ringserve: tracing needs opentelemetry-sdk and its OTLP exporter ({exc.name} "
                "is missing): pip install 'ringserve[tracing]'"
            ) from None

    def choose_runtime(self, on_gpu: bool) -> None:
        """Resolve --runtime once here (workers resolve it the same way) and say what int8
        costs when it is asked for: the figure measured when the artifact was built."""
        s = self.settings
        try:
            self.runtime, note = choose_runtime(s.runtime, s.precision, on_gpu, self.manifest)
        except ValueError as exc:
            raise SystemExit(f"ringserve: {exc}") from None
        if note:
            self.log.warning("runtime_fallback", runtime=self.runtime, reason=note)
        if self.runtime == "onnx" and s.precision == "fp32":
            self.choose_graph()
        if s.precision == "int8" and not on_gpu:
            self.log.warning("int8_cost", **self.manifest.int8)
            cost = self.manifest.int8
            if "min_cosine" in cost:  # an embed-only model: how far int8 turns its vectors
                print(
                    f"ringserve: --precision int8: cosine to fp32 at least {cost['min_cosine']} "
                    f"(mean {cost.get('mean_cosine')}) on {cost.get('texts')} held-out texts",
                    file=sys.stderr,
                )
                return
            speed = f", {cost['speedup']}x fp32's speed here" if "speedup" in cost else ""
            print(
                f"ringserve: --precision int8: accuracy cost {cost.get('accuracy_cost')} "
                f"({cost.get('accuracy_fp32')} -> {cost.get('accuracy_int8')}), same decision "
                f"as fp32 on {cost.get('argmax_agreement')} of {cost.get('texts')} held-out texts "
                f"(recipe: {cost.get('recipe', 'dynamic')}{speed})",
                file=sys.stderr,
            )

    def choose_graph(self) -> None:
        """Resolve --graph auto by timing both fp32 graphs on this CPU (workers/graphpick.py);
        the workers are given the resolved choice through the settings they are built from."""
        from ringserve.workers.graphpick import choose

        s = self.settings
        cache = Path(s.cache_dir) if s.cache_dir else default_cache_dir()
        self.graph = choose(self.model_dir, self.manifest, s.graph, cache)
        s.graph = self.graph["graph"]
        self.log.info("graph_chosen", **self.graph)
        ms = self.graph.get("ms")
        timing = f": {', '.join(f'{g} {t} ms' for g, t in ms.items())}" if ms else ""
        print(
            f"ringserve: serving the {s.graph} fp32 graph ({self.graph['chosen_by']}{timing})",
            file=sys.stderr,
        )

    async def start_listeners(self) -> None:
        s = self.settings
        router = self.inference_router()
        route = router if self.keys is None else guard_http(self.keys, router)
        self.http_state = HttpServerState(s, route, self.count)
        state = self.http_state
        if s.access_log:
            from ringserve.service.ops.metrics import access_logger

            state.access_log = access_logger(self)
        peer = live_peer(s.control, self.control_path) if s.reuse_port else None
        if peer is not None:  # a live server on our ports: take its sockets, not new ones
            self.inherited = fetch_listeners(peer, s.api_key)
        http = await listen(self, "http", lambda: HttpProtocol(state), s.host, s.port, 2048)
        self.listeners.append(http)
        if s.operator_port:
            operator, self.operator_state = await self.start_operator()
            self.listeners.append(operator)
        if s.binary_port:
            from ringserve.service.protocols.binary import start_binary

            self.listeners.append(await start_binary(self, s.host, s.binary_port))
        if s.grpc_port:  # grpcio is imported only when the port is on
            from ringserve.service.protocols.rpc.server import GrpcPort

            self.grpc = GrpcPort(self)
            await self.grpc.start(s.host, s.grpc_port)
        for sock in self.inherited.values():  # a port we no longer serve on
            sock.close()
        self.inherited = {}

    async def start_operator(self) -> tuple[asyncio.AbstractServer, HttpServerState]:
        """The operator listener: /metrics, /v1/stats and /dashboard only, no key (bind it to a
        private address with --operator-host)."""
        s = self.settings
        router = Router(self)
        self.add_metrics(router)
        openapi.register(router, key=False)
        state = HttpServerState(s, router, self.count)
        state.access_log = self.http_state.access_log if self.http_state else None
        host = s.operator_host or s.host
        make = lambda: HttpProtocol(state)  # noqa: E731 - one line, named for the call below
        return await listen(self, "operator", make, host, s.operator_port, 128), state

    async def start_control(self) -> None:
        s = self.settings
        self.control_path = choose_control_path(s.control, s.reuse_port)

        def make() -> ControlProtocol:
            return ControlProtocol(self, self.api_key, self.count, s.max_control_line)

        self.listeners.append(await start_control(self.control_path, make))

    async def notify_ready(self, sup: asyncio.Task[Any]) -> None:
        """Tell systemd (Type=notify) we serve: listening, and a worker ready."""
        if await self.first_worker_ready(sup):
            sd_notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving")

    async def first_worker_ready(self, sup: asyncio.Task[Any]) -> bool:
        """With --reuse-port the kernel shares new connections among every listener on the port,
        so a server still loading its model must not listen yet: bind once a worker is ready."""
        assert self.stop_event is not None
        while self.supervisor.ready_count() == 0:
            if sup.done() or self.stop_event.is_set() or self.supervisor.fatal:
                return False
            await asyncio.sleep(0.02)
        return True

    def inference_router(self) -> Router:
        """Every route of the inference port, /openapi.json last: it documents the others."""
        router = Router(self)
        v1_routes(router)
        task_routes(router)
        self.add_routes(router)
        openapi.register(router, key=self.keys is not None)
        return router

    def add_routes(self, router: Router) -> None:
        from ringserve.service.protocols import kserve

        kserve.register(router)
        if not self.settings.operator_port:  # else they live on the operator listener
            self.add_metrics(router)

    def add_metrics(self, router: Router) -> None:
        """The operator routes, and their collectors wired in: the pool hands each released
        worker's last counters over, and every answer is observed (unless --metrics 0)."""
        m = metrics.register(router, self)
        self.supervisor.on_release = m.workers.retire
        if self.settings.metrics:  # 0: nothing is counted per request (overhead baseline)
            self.stats = m.stats

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        self.prepare()
        await self.start_control()
        if not self.settings.reuse_port:
            await self.start_listeners()  # a port in use fails the start at once
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.on_stop_signal, signal.Signals(sig).name)
        loop.add_signal_handler(signal.SIGHUP, self.on_reload_signal)
        sup = asyncio.create_task(self.supervisor.run())
        sweeper = asyncio.create_task(self.sweep())
        if self.settings.reuse_port and await self.first_worker_ready(sup):
            await self.start_listeners()
        self.log.info(
            "start",
            pid=os.getpid(),
            host=self.settings.host,
            port=self.settings.port,
            operator_port=self.settings.operator_port or None,
            api_key="set" if self.api_key else "none",  # never the key itself
            api_keys=len(self.keys.entries) if self.keys is not None else 0,
            tracing=self.admission.tracing is not None,
            control=self.control_path,
            reuse_port=self.settings.reuse_port,
            model=self.model_name,
            fingerprint=self.manifest.fingerprint,
            device=self.device,
            workers=self.supervisor.target,
            spares=self.settings.spares,
        )
        notify = asyncio.create_task(self.notify_ready(sup))
        stop_wait = asyncio.create_task(self.stop_event.wait())
        await asyncio.wait([sup, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if self.supervisor.fatal:
            self.log.error("fatal", reason=self.supervisor.fatal)
            print(f"ringserve: {self.supervisor.fatal}", file=sys.stderr)
            code = 1
        await self.drain()
        for task in (sup, sweeper, stop_wait, notify):
            task.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        self.log.info("exit", code=code)
        return code

    def request_stop(self, reason: str) -> None:
        """Readiness turns 503 at once; the drain begins after --shutdown-delay-s, so that load
        balancers stop sending before the listeners close, while we still serve what comes."""
        if self.stop_event is None or self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        sd_notify("STOPPING=1")
        delay = self.settings.shutdown_delay_s
        self.log.info("stopping", reason=reason, shutdown_delay_s=delay)
        if self.grpc is not None:  # health says NOT_SERVING now, as readiness answers 503
            self.grpc.update_health()
        asyncio.get_running_loop().call_later(max(0.0, delay), self.stop_event.set)

    def on_stop_signal(self, name: str) -> None:
        """The first SIGINT or SIGTERM drains; a second one stops at once."""
        if self.stopping:
            self.stop_now(name)
        else:
            self.request_stop(name)

    def stop_now(self, reason: str) -> None:
        """No shutdown delay, no waiting for what is owed (it is answered 500), workers killed;
        the clean-up still runs: workers reaped, segments and the control socket removed."""
        if self.hurry or self.stop_event is None:
            return
        self.hurry = True
        self.log.warning("stop_now", reason=reason, inflight=self.dispatcher.depth)
        self.stop_event.set()
        if self.supervisor.stopping:  # already stopping the workers: do not wait for them
            for handle in list(self.supervisor.all.values()):
                handle.signal(signal.SIGKILL)

    def on_reload_signal(self) -> None:
        self.keep(asyncio.create_task(self.reload("SIGHUP")))

    def keep(self, task: asyncio.Task[Any]) -> None:
        self.tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self.tasks.discard)

    async def reload(self, reason: str) -> str | None:
        """Re-read and verify the artifact (hashing it in a thread, off the loop), then roll
        every worker onto it; the error, if any. A reload asked for during one shares it."""
        if self.draining:
            return "server is draining"
        if self.reloading is None:
            self.reloading = asyncio.ensure_future(self._reload(reason))
            self.reloading.add_done_callback(lambda _: setattr(self, "reloading", None))
        return await asyncio.shield(self.reloading)

    async def _reload(self, reason: str) -> str | None:
        if self.keys is not None:  # a bad key file refuses the whole reload: nothing changes
            error = self.keys.reload()
            if error is not None:
                self.log.error("reload_refused", reason=error, by=reason)
                return f"reload refused: {error}"
            self.log.info("keys_reloaded", keys=len(self.keys.entries), by=reason)
        try:
            manifest = await asyncio.to_thread(load_manifest, self.model_dir)
        except ArtifactError as exc:
            self.log.error("reload_refused", reason=str(exc), by=reason)
            return str(exc)
        old = self.manifest
        if (manifest.labels, manifest.task, manifest.dimension) != (
            old.labels,
            old.task,
            old.dimension,
        ):
            msg = (
                "reload refused: the new artifact's labels, tasks or dimension differ "
                "(restart the server instead)"
            )
            self.log.error("reload_refused", reason=msg, by=reason)
            return msg
        if self.draining:  # began while the artifact was being read
            return "server is draining"
        self.manifest = manifest
        self.supervisor.reload()
        return None

    async def drain(self) -> None:
        """Close the listeners and every idle connection, serve what is owed (each answer with
        `connection: close`), and end as soon as nothing is owed or at the drain timeout. Then
        stop the workers and remove what this server made."""
        self.log.info("drain", reason=self.stop_reason, inflight=self.dispatcher.depth)
        self.draining = True
        self.supervisor.draining = True  # no worker is started from here on
        for listener in self.listeners:
            listener.close()
        for state in self.http_states():
            state.begin_drain()
        if self.binary_state is not None:
            for bconn in list(self.binary_state.connections):
                bconn.begin_drain()
        if self.grpc is not None:  # GOAWAY; the calls in flight finish
            self.grpc.begin_drain(self.settings.drain_timeout_s)
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while self.draining_work() and time.monotonic() < deadline and not self.supervisor.fatal:
            if self.hurry:
                break
            await asyncio.sleep(0.01)
        self.dispatcher.accepting = False
        if self.dispatcher.depth:
            self.log.warning("drain_timeout", unanswered=self.dispatcher.depth)
            self.dispatcher.fail_all()
        await asyncio.sleep(0)  # let the last answers reach their transports
        self.close_connections()
        if self.grpc is not None:
            await self.grpc.close()
        await self.supervisor.stop(HURRY_GRACE_S if self.hurry else STOP_GRACE_S)
        if self.admission.tracing is not None:  # the last spans, off the loop, bounded
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(self.admission.tracing.shutdown), 3.0)
        self.remove_control()
        stop_resource_tracker()
        left = segment.list_segments(os.getpid())
        if left:
            self.log.warning("segments_left", names=left)

    def draining_work(self) -> bool:
        """Something is still owed: a request in flight, an answer unwritten, or a request
        being read. An idle connection owes nothing and never holds the exit back."""
        if self.dispatcher.depth:
            return True
        if any(state.owed() for state in self.http_states()):
            return True
        if self.grpc is not None and self.grpc.inflight:
            return True
        bstate = self.binary_state
        return bstate is not None and any(c.owes() for c in bstate.connections)

    def close_connections(self) -> None:
        for state in self.http_states():
            for conn in list(state.connections):
                if conn.transport is not None:
                    conn.transport.close()
        if self.binary_state is not None:
            for bconn in list(self.binary_state.connections):
                bconn.close_now()

    def remove_control(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.control_path)

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            now, now_ns = time.monotonic(), time.monotonic_ns()
            for state in self.http_states():
                for conn in list(state.connections):
                    conn.sweep(now_ns)
            if self.binary_state is not None:
                for bconn in list(self.binary_state.connections):
                    bconn.sweep(now)
            if self.grpc is not None:
                self.grpc.update_health()

    def http_states(self) -> list[HttpServerState]:
        return [s for s in (self.http_state, self.operator_state) if s is not None]

    # -- views ----------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """Served under --model-name when given (KServe names it), else the artifact's name."""
        return self.settings.model_name or self.manifest.name

    def ready(self) -> bool:
        return not self.stopping and not self.draining and self.supervisor.ready_count() > 0

    def status(self) -> dict[str, Any]:
        return {
            "uptime_s": round(time.monotonic() - self.started, 3),
            "queue_depth": self.dispatcher.depth,
            "draining": self.draining,
            "restarts_total": self.supervisor.restarts_total,
            "model": {"name": self.model_name, "fingerprint": self.manifest.fingerprint},
            "workers": self.supervisor.status_rows(),
        }

    # -- what the control socket may do (service.control.Admin) --------------------------------
    def restart(self, slot: int) -> str | None:
        if self.draining:
            return "server is draining"
        if not self.supervisor.restart(slot):
            return f"no serving worker with id {slot}"
        return None

    def scale(self, workers: int) -> str | None:
        if self.draining:
            return "server is draining"
        self.supervisor.scale(workers)
        return None

    def stop(self, reason: str) -> None:
        self.request_stop(reason)

    def generation(self) -> int:
        return self.supervisor.generation

    def handover_sockets(self) -> tuple[list[str], list[int]] | str:
        if self.draining:
            return "server is draining: its listeners are closed"
        return listening_fds(self)

    def refusal(self) -> str:
        """Why the dispatcher refuses a request now (the message of its 503)."""
        if self.supervisor.fatal:
            return "no worker can serve"
        return "server is draining" if self.draining else self.dispatcher.why

    def count(self, protocol: str, code: int, n: int = 1, tenant: Tenant | None = None) -> None:
        """One more answer written (n more): called only where answers are written."""
        name = ""
        if tenant is not None and self.keys is not None and self.keys.named:
            name = tenant.name
            by = self.keys.counts(name).codes.setdefault(protocol, {})
            by[code] = by.get(code, 0) + n
        key = (protocol, code, name)
        self.requests_total[key] = self.requests_total.get(key, 0) + n

    def on_result(self, group: Group, result: Result, latency_ns: int) -> None:
        if self.stats is not None:
            self.stats.observe(group, result, latency_ns)


def load_keys(settings: Config) -> KeyRing | None:
    """--api-key (one unnamed key) and --api-keys FILE together; None when neither is set. A
    bad line stops the start with its line number (never the key)."""
    if settings.api_key is None and settings.api_keys is None:
        return None
    try:
        return KeyRing(settings.api_key, settings.api_keys)
    except KeyFileError as exc:
        raise SystemExit(f"ringserve: --api-keys: {exc}") from None


def stop_resource_tracker() -> None:
    """multiprocessing starts a resource tracker with the first spawned process; it exits when
    we do, and would stay a zombie until init reaps it. Stop and reap it here (we track no
    resource with it: our segments are ours to unlink)."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # private, since 3.8
    if stop is not None:
        with contextlib.suppress(OSError, ChildProcessError):
            stop()


def serve(settings: Config) -> int:
    import uvloop

    server = Server(settings)
    return uvloop.run(server.run())
