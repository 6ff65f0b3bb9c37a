"""Operators' views over HTTP: the collectors behind `/metrics` (written by ops.prometheus),
the `/v1/stats` snapshot, `/dashboard`, and the optional access log.

Counting happens in ops.stats; this module only reads. It wires nothing: the composition root
(service/app.py) hands `Metrics.stats` to the server and `Metrics.workers.retire` to the pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ringserve.service.engine.tenants import PRIORITY_NAMES
from ringserve.service.logs import EventLog
from ringserve.service.ops import prometheus
from ringserve.service.ops.stats import (
    OverloadWatch,
    Stats,
    WorkerTotals,
    gpu_readings,
    graph_report,
)
from ringserve.service.ops.views import MetricsView
from ringserve.service.protocols.endpoint import Endpoint, Handler, ok
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router
from ringserve.workers.spec import is_gpu_device

TICK_S = 0.25  # window rotation, worker counter sampling and overload detection
DASHBOARD = Path(__file__).with_name("static") / "dashboard.html"


class MetricsSource(MetricsView, Protocol):
    """The server's view, with the Stats that app.py made and wired (observe: unless
    --metrics 0)."""

    @property
    def stats(self) -> Stats: ...


class Metrics:
    """The collectors of one server, and what operators read of them. Built unwired: the caller
    connects `stats` (per answer, unless --metrics 0) and `workers.retire` (per released worker)."""

    def __init__(self, server: MetricsSource) -> None:
        self.server = server
        self.stats = server.stats  # made and wired in app.py (observe: unless --metrics 0)
        self.workers = WorkerTotals()
        self.overload = OverloadWatch(server.dispatcher, server.log)
        self.totals = self.workers.refresh(server.supervisor)
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
            len(h.link.assigned) for h in self.server.supervisor.retiring
        )

    def worker_rows(self) -> list[dict[str, Any]]:
        """The control socket's status rows, plus what each has served: a serving slot's row
        what its processes served together (a replacement keeps counting on), a spare's its
        own."""
        sup = self.server.supervisor
        by_pid = {h.pid: h for h in sup.all.values()}
        rows = sup.status_rows()
        for row in rows:
            handle = by_pid.get(row["pid"])
            seen = self.workers.seen.get(handle.serial if handle is not None else -1)
            if row["id"] >= 0:  # a serving slot: every process it had, across replacements
                seen = self.workers.slot_totals(row["id"])
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
            "model": {"name": server.model.name, "device": server.model.device},
            "buckets": list(server.model.buckets),
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
            # The queue's measured delay: how long its oldest waiting text has waited (0: none
            # waits); past --max-queue-ms for an interval the queue stands and refuses.
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
                "dropped": server.dropped,  # their client had gone: never run
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
        doc["models"] = self.models(now_ns)
        doc.update(self.stats.last_minute())
        return doc

    def models(self, now_ns: int) -> dict[str, Any]:
        """Each model the dispatcher serves, by name: its texts answered, a second, its
        latency over the last minute, and its queue (admitted and unanswered, its limit, how
        many wait, how many it refused). A closed model shows while it still owes answers; two
        of one name (an old version and its successor) show as one. The first model may be
        unnamed there: it is the server's model."""
        d, server = self.server.dispatcher, self.server
        out: dict[str, Any] = {}
        for lane in sorted(d.models.values(), key=lambda lane: lane.index):
            if not lane.open and not lane.depth:
                continue
            name = lane.name or server.model.name
            entry = out.get(name)
            if entry is None:
                if lane.name:
                    entry = self.stats.model_minute(lane.name, now_ns)
                else:  # never opened by name: the one model, whose numbers are the totals
                    entry = self.stats.overall_minute(sum(d.answered_by_task.values()), now_ns)
                entry.update(open=False, queue_depth=0, waiting=0, rejected=0, bulk_texts=0)
                out[name] = entry
            if lane.open or not entry["open"]:  # an open one's index and limit go first
                limit = lane.max_queue or d.max_queue
                level = PRIORITY_NAMES[lane.priority]
                entry.update(open=lane.open, index=lane.index, max_queue=limit, priority=level)
            entry["queue_depth"] += lane.depth
            entry["waiting"] += d.waiting.waiting_for(lane.index)
            entry["rejected"] += lane.rejected
            entry["bulk_texts"] += lane.bulk_texts  # admitted at bulk, by any of the three
        return out

    def render(self) -> bytes:
        """The /metrics text, from one fresh reading."""
        self.stats.rotate(time.monotonic_ns())
        self.totals = self.workers.refresh(self.server.supervisor)
        reading = prometheus.Reading(
            self.server, self.stats, self.totals, self.inflight(), self.overload.active
        )
        return prometheus.exposition(reading)


# -- HTTP ---------------------------------------------------------------------------------------
NO_STORE = [(b"cache-control", b"no-store")]


def text(metrics: Metrics) -> Handler:
    def serve(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, metrics.render(), prometheus.CONTENT_TYPE, NO_STORE)

    return serve


def stats(metrics: Metrics) -> Handler:
    def serve(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, json.dumps(metrics.snapshot()).encode(), extra=NO_STORE)

    return serve


def dashboard(metrics: Metrics) -> Handler:
    page = DASHBOARD.read_bytes()

    def serve(conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
        conn.respond(ex, 200, page, b"text/html; charset=utf-8", NO_STORE)

    return serve


ROUTES = [
    Endpoint("GET", "/metrics", text, "Prometheus metrics", "operator",
             ok("text exposition format 0.0.4", None, "text/plain")),
    Endpoint("GET", "/v1/stats", stats, "JSON for dashboards", "operator",
             ok("the server's figures", "stats")),
    Endpoint("GET", "/dashboard", dashboard, "The operator page", "operator",
             ok("an HTML page", None, "text/html")),
]  # fmt: skip


def register(router: Router, server: MetricsSource) -> Metrics:
    """Add /metrics, /v1/stats and /dashboard, and start the metrics tick. The caller wires the
    returned collectors into the server and the pool."""
    metrics = Metrics(server)
    router.mount(ROUTES, metrics)
    metrics.start()
    return metrics


def access_logger(server: MetricsSource) -> Callable[[Exchange, int], None]:
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
