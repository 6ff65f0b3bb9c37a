"""Operators' views over HTTP: Prometheus `/metrics`, the `/v1/stats` snapshot, `/dashboard`,
and the optional access log.

The exposition text is written here (format 0.0.4, which prometheus_client's parser reads), so
serving needs no extra dependency. Counting happens in service.stats; this module only reads.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.engine.tenants import KeyRing
from ringserve.service.logs import EventLog
from ringserve.service.ops.stats import (
    PROM_BOUNDS_S,
    OverloadWatch,
    Stats,
    WorkerTotals,
    gpu_readings,
    graph_report,
    prom_buckets,
)
from ringserve.service.pool.handle import DEAD, DEGRADED, DRAINING, READY, SPARE, STARTING
from ringserve.service.pool.supervisor import Supervisor
from ringserve.service.protocols.auth import ApiKey
from ringserve.service.protocols.http import Exchange, HttpProtocol, HttpServerState
from ringserve.service.protocols.routes import Router
from ringserve.service.settings import Config
from ringserve.shm import layout as L
from ringserve.workers.artifact import Manifest
from ringserve.workers.spec import is_gpu_device


class MetricsView(Protocol):
    """What the metrics read of the server."""

    @property
    def stats(self) -> Stats: ...
    @property
    def settings(self) -> Config: ...
    @property
    def log(self) -> EventLog: ...
    @property
    def started(self) -> float: ...
    @property
    def draining(self) -> bool: ...
    @property
    def api_key(self) -> ApiKey | None: ...
    @property
    def keys(self) -> KeyRing | None: ...
    @property
    def dispatcher(self) -> Dispatcher: ...
    @property
    def supervisor(self) -> Supervisor: ...
    @property
    def http_state(self) -> HttpServerState | None: ...
    @property
    def requests_total(self) -> dict[tuple[str, int, str], int]: ...
    @property
    def manifest(self) -> Manifest: ...
    @property
    def model_name(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def buckets(self) -> tuple[int, ...]: ...


TICK_S = 0.25  # window rotation, worker counter sampling and overload detection
PROM_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
DASHBOARD = Path(__file__).with_name("static") / "dashboard.html"
AUTH_PROTOCOLS = ("http", "kserve", "binary", "grpc", "control")  # ringserve_auth_failures_total
STATES = (STARTING, READY, DEGRADED, DRAINING, SPARE, DEAD)
# Exported only while some worker runs on CUDA; tests and deploy/grafana check against this list.
GPU_METRICS = (
    "ringserve_gpu_memory_used_bytes",
    "ringserve_gpu_memory_total_bytes",
    "ringserve_gpu_utilization_ratio",
    "ringserve_gpu_temperature_celsius",
    "ringserve_gpu_power_watts",
    "ringserve_worker_cuda_reserved_bytes",
    "ringserve_worker_cuda_allocated_bytes",
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class Exposition:
    """Writes the Prometheus text format, one metric family at a time."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        if labels:
            inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{inner}}} {_number(value)}")
        else:
            self.lines.append(f"{name} {_number(value)}")

    def single(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.family(name, kind, help_text)
        self.sample(name, value)

    def labelled(
        self, name: str, kind: str, help_text: str, rows: Iterable[tuple[dict[str, str], float]]
    ) -> None:
        self.family(name, kind, help_text)
        for labels, value in rows:
            self.sample(name, value, labels)

    def histogram(
        self,
        name: str,
        labels: dict[str, str],
        bounds: Iterable[float],
        cumulative: list[int],
        total: float,
    ) -> None:
        """One labelled histogram; `cumulative` has one count per bound plus +Inf last."""
        for bound, count in zip([*bounds, math.inf], cumulative, strict=True):
            self.sample(f"{name}_bucket", count, {**labels, "le": _number(float(bound))})
        self.sample(f"{name}_sum", total, labels)
        self.sample(f"{name}_count", cumulative[-1], labels)

    def text(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()


class Metrics:
    """Wires the collectors into one server and renders what they hold."""

    def __init__(self, server: MetricsView) -> None:
        self.server = server
        self.stats = server.stats  # made and wired in app.py (observe: unless --metrics 0)
        self.workers = WorkerTotals()
        self.overload = OverloadWatch(server.dispatcher, server.log)
        self.totals = self.workers.refresh(server.supervisor)
        server.supervisor.on_release = self.workers.retire
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- the tick -------------------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop.call_later(TICK_S, self.tick)

    def tick(self) -> None:
        try:
            self.stats.rotate(time.monotonic_ns())
            self.totals = self.workers.refresh(self.server.supervisor)
            self.overload.check(time.monotonic(), self.server.draining)
        except Exception as exc:  # noqa: BLE001 - a metrics bug must not stop the ticks
            self.server.log.emit("metrics_error", level=logging.ERROR, error=repr(exc))
        finally:
            assert self.loop is not None
            self.loop.call_later(TICK_S, self.tick)

    # -- views ----------------------------------------------------------------------------------
    def inflight(self) -> int:
        """Requests handed to a worker and not yet answered."""
        return sum(len(h.assigned) for h in self.server.dispatcher.serving) + sum(
            len(h.assigned) for h in self.server.supervisor.retiring
        )

    def worker_rows(self) -> list[dict[str, Any]]:
        """The control socket's status rows, plus what each process has served."""
        sup = self.server.supervisor
        by_pid = {h.pid: h for h in sup.all.values()}
        rows = sup.status_rows()
        for row in rows:
            handle = by_pid.get(row["pid"])
            seen = self.workers.seen.get(handle.serial if handle is not None else -1)
            row["requests"] = seen[0] if seen else 0
            row["batches"] = seen[1] if seen else 0
            if handle is not None and is_gpu_device(handle.device):
                row.update(graph_report(handle))
        return rows

    def snapshot(self) -> dict[str, Any]:
        server = self.server
        sup = server.supervisor
        now_ns = time.monotonic_ns()
        self.stats.rotate(now_ns)
        self.totals = self.workers.refresh(sup)
        named = WorkerTotals.named(self.totals)
        padded = named["padded_tokens"]
        doc: dict[str, Any] = {
            "uptime_s": round(time.monotonic() - server.started, 3),
            "model": {"name": server.model_name, "device": server.device},
            "buckets": list(server.buckets),
            "metrics": bool(server.settings.metrics),
            "draining": server.draining,
            "overloaded": self.overload.active,
            "queue_depth": server.dispatcher.depth,
            "max_queue": server.dispatcher.max_queue,
            "inflight": self.inflight(),
            "waiting": len(server.dispatcher.waiting),
            "waiting_bulk": len(server.dispatcher.waiting.bulk),
            "bulk_max_wait_ms": server.settings.bulk_max_wait_ms,
            # One row per tenant of --api-keys: its keys' limits and what it was answered.
            "tenants": server.keys.table() if server.keys is not None else [],
            # The wait a text admitted now is estimated to have (None until the pool has been
            # measured): the queued work over the pool's tokens/s; --max-queue-ms bounds it.
            "queue_wait_ms": server.dispatcher.wait_ms(),
            "max_queue_ms": server.dispatcher.max_queue_ms,
            "pool_tokens_per_s": _round(server.dispatcher.rate()),
            "requests_per_s": self.stats.requests_per_s(now_ns),
            "requests_per_s_history": self.stats.history(),
            "workers": self.worker_rows(),
            "restarts_total": sup.restarts_total,
            "gpus": gpu_readings(sup),
            "totals": {
                "requests": sum(server.requests_total.values()),
                "rejected": server.dispatcher.rejected,
                "timed_out": server.dispatcher.expired,
                "answered": named["requests"],
                "batches": named["batches"],
                "tokens": named["tokens"],
                "padded_tokens": padded,
                "padding_waste": round(1 - named["tokens"] / padded, 4) if padded else 0.0,
                "cpu_fallbacks": named["fallbacks"],
                # Texts answered by task (a rerank counts its documents).
                "tasks": dict(server.dispatcher.answered_by_task),
            },
        }
        doc.update(self.stats.last_minute())
        return doc

    def render(self) -> bytes:
        self.stats.rotate(time.monotonic_ns())
        self.totals = self.workers.refresh(self.server.supervisor)
        out = Exposition()
        self._render_requests(out)
        self._render_timings(out)
        self._render_queue(out)
        self._render_server(out)
        self._render_slots(out)
        self._render_processes(out)
        self._render_worker_counters(out)
        self._render_gpus(out)
        return out.text()

    # -- exposition, family by family -----------------------------------------------------------
    def _render_requests(self, out: Exposition) -> None:
        server = self.server
        out.labelled(
            "ringserve_requests_total",
            "counter",
            "Client requests answered, by protocol and status code (and tenant, with "
            "--api-keys: the tenant of the request's key).",
            (
                ({"protocol": p, "code": str(c), **({"tenant": t} if t else {})}, n)
                for (p, c, t), n in sorted(server.requests_total.items())
            ),
        )
        refused = dict.fromkeys(AUTH_PROTOCOLS, 0)  # all present from the start, for rate()
        for source in (server.api_key, server.keys):
            for p, n in (source.failures if source is not None else {}).items():
                refused[p] += n
        out.labelled(
            "ringserve_auth_failures_total",
            "counter",
            "Requests refused for a missing or wrong API key (401, a closed binary connection, "
            "a refused control command), by protocol.",
            (({"protocol": p}, n) for p, n in sorted(refused.items())),
        )
        if server.keys is not None and server.keys.named:
            out.labelled(
                "ringserve_rate_limited_total",
                "counter",
                "Requests over their key's rate (429, binary status 6), by tenant.",
                (({"tenant": t}, c.limited) for t, c in sorted(server.keys.tenants.items())),
            )
            out.labelled(
                "ringserve_tenant_texts_total",
                "counter",
                "Texts admitted, by tenant.",
                (({"tenant": t}, c.texts) for t, c in sorted(server.keys.tenants.items())),
            )
        d = server.dispatcher
        out.single(
            "ringserve_rejected_requests_total",
            "counter",
            "Texts refused at admission (queue full, draining or no worker): answered 503.",
            d.rejected,
        )
        wait = d.wait_ms()
        if wait is not None:
            out.single(
                "ringserve_queue_wait_seconds",
                "gauge",
                "Estimated wait of a text admitted now: queued tokens over the pool's measured "
                "tokens/s (--max-queue-ms refuses past it).",
                wait / 1000,
            )
        out.labelled(
            "ringserve_task_texts_total",
            "counter",
            "Texts answered (any status), by task: classify, embed, or rerank (its documents).",
            (({"task": t}, n) for t, n in d.answered_by_task.items()),
        )
        out.single(
            "ringserve_timed_out_requests_total",
            "counter",
            "Texts whose deadline passed before an answer: answered 504.",
            d.expired,
        )
        out.single(
            "ringserve_failed_requests_total",
            "counter",
            "Texts answered with an error status (timeout, bad input, internal).",
            self.stats.failed,
        )

    def _render_timings(self, out: Exposition) -> None:
        s = self.stats
        families = (
            ("ringserve_request_latency_seconds", "Admission to answer, per text.", s.lat, 1e-9),
            (
                "ringserve_request_queued_seconds",
                "Time a text waited inside its worker before its batch ran.",
                s.queued,
                1e-6,
            ),
            (
                "ringserve_request_model_seconds",
                "Model time of the batch that served the text.",
                s.model,
                1e-6,
            ),
        )
        sums = {
            "ringserve_request_latency_seconds": s.lat_sum_ns,
            "ringserve_request_queued_seconds": s.queued_sum_us,
            "ringserve_request_model_seconds": s.model_sum_us,
        }
        for name, help_text, bins, scale in families:
            out.family(name, "histogram", help_text + " Label bucket: the length bucket (tokens).")
            for b, length in enumerate(self.server.buckets):
                out.histogram(
                    name,
                    {"bucket": str(length)},
                    PROM_BOUNDS_S,
                    prom_buckets(bins[b]),
                    sums[name][b] * scale,
                )

    def _render_queue(self, out: Exposition) -> None:
        d = self.server.dispatcher
        gauges = (
            (
                "ringserve_queue_depth",
                "Texts admitted and not yet answered (bounded by --max-queue).",
                d.depth,
            ),
            ("ringserve_queue_limit", "The --max-queue limit.", d.max_queue),
            ("ringserve_inflight", "Texts handed to a worker, not answered.", self.inflight()),
            ("ringserve_waiting", "Texts admitted but not yet in a worker's ring.", len(d.waiting)),
            (
                "ringserve_overloaded",
                "1 while the server is refusing requests for lack of queue room.",
                int(self.overload.active),
            ),
        )
        for name, help_text, value in gauges:
            out.single(name, "gauge", help_text, value)

    def _render_server(self, out: Exposition) -> None:
        server = self.server
        conns = len(server.http_state.connections) if server.http_state is not None else 0
        uptime = time.monotonic() - server.started
        out.single(
            "ringserve_draining", "gauge", "1 while the server drains.", int(server.draining)
        )
        out.single("ringserve_uptime_seconds", "gauge", "Seconds since start.", uptime)
        out.single("ringserve_http_connections", "gauge", "Open HTTP connections.", conns)
        m = server.manifest
        info = {"name": m.name, "fingerprint": m.fingerprint, "device": server.device}
        out.labelled("ringserve_model_info", "gauge", "The model being served.", [(info, 1)])

    def _render_slots(self, out: Exposition) -> None:
        """Per worker slot (stable ids): whether it serves, and how often it was replaced."""
        sup = self.server.supervisor
        slots = sorted(set(range(sup.target)) | set(sup.slots) | set(sup.restarts))
        serving = {s for s, h in sup.slots.items() if h is not None and h.serving()}
        out.labelled(
            "ringserve_worker_up",
            "gauge",
            "1 when the worker slot has a process serving requests.",
            (({"worker": str(s)}, int(s in serving)) for s in slots),
        )
        out.labelled(
            "ringserve_worker_restarts_total",
            "counter",
            "Times the worker slot's process was replaced (crash, hang, restart, recycle).",
            (({"worker": str(s)}, sup.restarts.get(s, 0)) for s in slots),
        )

    def _render_processes(self, out: Exposition) -> None:
        """Per worker process, as the control socket lists them (spares have negative ids)."""
        rows = self.server.supervisor.status_rows()
        per_row = (
            (
                "ringserve_worker_rss_bytes",
                "Resident memory of the worker process.",
                "rss_bytes",
                1,
            ),
            ("ringserve_worker_inflight", "Texts the worker holds.", "inflight", 1),
            (
                "ringserve_worker_heartbeat_age_seconds",
                "Age of the worker's last heartbeat (absent before its first).",
                "heartbeat_age_ms",
                1e-3,
            ),
        )
        for name, help_text, key, scale in per_row:
            samples = (
                ({"worker": str(r["id"])}, r[key] * scale) for r in rows if r[key] is not None
            )
            out.labelled(name, "gauge", help_text + " Spares have negative ids.", samples)
        out.labelled(
            "ringserve_worker_state",
            "gauge",
            "1 for the worker's current state.",
            (
                ({"worker": str(r["id"]), "state": st}, int(r["state"] == st))
                for r in rows
                for st in STATES
            ),
        )
        out.labelled(
            "ringserve_workers",
            "gauge",
            "Worker processes by state.",
            (({"state": st}, sum(1 for r in rows if r["state"] == st)) for st in STATES),
        )

    def _render_worker_counters(self, out: Exposition) -> None:
        named = WorkerTotals.named(self.totals)
        hist = WorkerTotals.batch_hist(self.totals)
        cumulative = [sum(hist[: i + 1]) for i in range(len(hist))]
        cumulative.append(cumulative[-1])  # sizes above the top bound count in the top bin
        out.family("ringserve_batch_size", "histogram", "Texts per model batch, all workers.")
        out.histogram(
            "ringserve_batch_size",
            {},
            [float(b) for b in L.BATCH_BOUNDS],
            cumulative,
            named["rows"],  # rows, not answers: a windowed text's windows are rows of batches
        )
        counters = (
            ("ringserve_tokens_total", "Real tokens run through the model.", "tokens", 1),
            (
                "ringserve_padded_tokens_total",
                "Tokens run through the model including padding (waste = 1 - tokens/padded).",
                "padded_tokens",
                1,
            ),
            (
                "ringserve_model_busy_seconds_total",
                "Time workers spent in the model.",
                "busy_ns",
                1e-9,
            ),
            (
                "ringserve_cpu_fallbacks_total",
                "Batches re-run on the CPU copy of the model after a CUDA out-of-memory error.",
                "fallbacks",
                1,
            ),
            (
                "ringserve_worker_expired_total",
                "Texts a worker skipped because their deadline had passed before their batch.",
                "expired",
                1,
            ),
            (
                "ringserve_bad_requests_total",
                "Texts a worker refused (empty, invalid UTF-8).",
                "bad_requests",
                1,
            ),
        )
        for name, help_text, key, scale in counters:
            value = named[key] * scale if scale != 1 else named[key]
            out.single(name, "counter", help_text, value)

    def _render_gpus(self, out: Exposition) -> None:
        gpus = gpu_readings(self.server.supervisor)
        if not gpus:
            return
        per_gpu = (
            ("ringserve_gpu_memory_used_bytes", "GPU memory in use (NVML).", "memory_used_bytes"),
            ("ringserve_gpu_memory_total_bytes", "GPU memory in all (NVML).", "memory_total_bytes"),
            ("ringserve_gpu_utilization_ratio", "GPU busy fraction (NVML), 0 to 1.", "utilization"),
            ("ringserve_gpu_temperature_celsius", "GPU temperature (NVML).", "temperature_c"),
            ("ringserve_gpu_power_watts", "GPU power draw (NVML).", "power_w"),
        )
        for name, help_text, key in per_gpu:  # an unknown reading (None) is left out
            samples = (({"gpu": str(g["index"])}, g[key]) for g in gpus if g[key] is not None)
            out.labelled(name, "gauge", help_text, samples)
        for name, key in (
            ("ringserve_worker_cuda_reserved_bytes", "cuda_reserved_bytes"),
            ("ringserve_worker_cuda_allocated_bytes", "cuda_allocated_bytes"),
        ):
            out.labelled(
                name,
                "gauge",
                "CUDA caching-allocator memory of the worker (torch.cuda).",
                (
                    ({"worker": str(w["id"]), "gpu": str(g["index"])}, w[key])
                    for g in gpus
                    for w in g["workers"]
                ),
            )


# -- HTTP ---------------------------------------------------------------------------------------
def register(router: Router, server: MetricsView) -> Metrics:
    """Add /metrics, /v1/stats and /dashboard, and start the metrics tick."""
    import json

    metrics = Metrics(server)
    page = DASHBOARD.read_bytes()
    no_store = [(b"cache-control", b"no-store")]

    def prometheus(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, metrics.render(), PROM_CONTENT_TYPE, no_store)

    def stats(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, json.dumps(metrics.snapshot()).encode(), extra=no_store)

    def dashboard(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, page, b"text/html; charset=utf-8", no_store)

    router.add("GET", "/metrics", prometheus)
    router.add("GET", "/v1/stats", stats)
    router.add("GET", "/dashboard", dashboard)
    metrics.start()
    return metrics


def access_logger(server: MetricsView) -> Callable[[Exchange, int], None]:
    """One JSON line per HTTP answer, whatever --log-level says (it was asked for)."""
    log = EventLog("info", server.log.stream)

    def write(ex: Exchange, status: int) -> None:
        latency = (time.monotonic_ns() - ex.done_ns) / 1e6 if ex.done_ns else None
        log.emit(
            "access",
            method=ex.method.decode("latin-1"),
            path=ex.url[:1024].decode("utf-8", "replace"),
            status=status,
            latency_ms=None if latency is None else round(latency, 2),
            request_id=ex.request_id.decode("latin-1"),
        )

    return write


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
