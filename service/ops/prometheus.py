"""The `/metrics` text: the Prometheus exposition format (0.0.4, which prometheus_client's parser
reads), written family by family from one `Reading` of the server and its collectors, so that
serving needs no extra dependency. Nothing here counts or changes what it reads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ringserve.service.engine.cache import AnswerCache
from ringserve.service.engine.tenants import KeyRing
from ringserve.service.ops.stats import (
    PROM_BOUNDS_S,
    Stats,
    WorkerTotals,
    gpu_readings,
    prom_buckets,
)
from ringserve.service.ops.views import MetricsView, PoolView
from ringserve.service.pool.handle import DEAD, DEGRADED, DRAINING, READY, SPARE, STARTING
from ringserve.shm import layout as L

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
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


@dataclass(frozen=True)
class Reading:
    """What one answer shows, read once: the server's view and what the collectors hold."""

    server: MetricsView
    stats: Stats
    totals: list[int]  # WorkerTotals, just refreshed
    inflight: int
    overloaded: bool


def exposition(r: Reading) -> bytes:
    out = Exposition()
    models = model_labels(r.server)
    answers(out, r.server, r.stats, models)
    refusals(out, r)
    timings(out, r.stats, r.server.model.buckets, models)
    queue(out, r)
    model_queues(out, r.server, models)
    server_facts(out, r.server)
    cache(out, r.server.cache)
    slots(out, r.server.supervisor)
    processes(out, r.server.supervisor)
    worker_counters(out, r.totals, r.stats, models)
    gpus(out, r.server.supervisor)
    return out.text()


def model_labels(server: MetricsView) -> dict[str, str]:
    """Stats' model name -> its `model` label, for every model ever opened; empty while the
    server has only ever held one, whose series carry no model label (as before there were
    many). The first model may be unnamed in the dispatcher: it is the server's model."""
    d = server.dispatcher
    if not d.many:
        return {}
    return {lane.name: lane.name or server.model.name for lane in d.models.values()}


# -- the families, in the order they are written ---------------------------------------------------
def answers(out: Exposition, server: MetricsView, stats: Stats, models: dict[str, str]) -> None:
    """What was answered, by protocol, status and tenant (and model, with many), and what no
    key could open."""
    out.labelled(
        "ringserve_requests_total",
        "counter",
        "Client requests answered, by protocol and status code (and tenant, with "
        "--api-keys: the tenant of the request's key; and model, with many models: answers "
        "about no model carry none).",
        request_rows(server.requests_total, stats.requests_by_model, models),
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
        tenants(out, server.keys)


def request_rows(
    total: Mapping[tuple[str, int, str], int],
    by_model: Mapping[tuple[str, int, str, str], int],
    models: dict[str, str],
) -> list[tuple[dict[str, str], int]]:
    """requests_total's samples: with many models, each answer in exactly one of them (about a
    model: labelled with it; about none: the rest, unlabelled), so a sum() counts it once."""

    def labels(p: str, c: int, t: str) -> dict[str, str]:
        return {"protocol": p, "code": str(c), **({"tenant": t} if t else {})}

    if not models:
        return [(labels(p, c, t), n) for (p, c, t), n in sorted(total.items())]
    rest = dict(total)
    rows: list[tuple[dict[str, str], int]] = []
    for (p, c, t, m), n in sorted(by_model.items()):
        rest[(p, c, t)] = rest.get((p, c, t), 0) - n
        rows.append(({**labels(p, c, t), "model": models.get(m, m)}, n))
    rows += [(labels(p, c, t), n) for (p, c, t), n in sorted(rest.items()) if n > 0]
    return rows


def tenants(out: Exposition, keys: KeyRing) -> None:
    out.labelled(
        "ringserve_rate_limited_total",
        "counter",
        "Requests over their key's rate (429, binary status 6), by tenant.",
        (({"tenant": t}, c.limited) for t, c in sorted(keys.tenants.items())),
    )
    out.labelled(
        "ringserve_tenant_texts_total",
        "counter",
        "Texts admitted, by tenant.",
        (({"tenant": t}, c.texts) for t, c in sorted(keys.tenants.items())),
    )


def refusals(out: Exposition, r: Reading) -> None:
    """Texts refused, expired or failed, the wait a new one would have, and texts by task."""
    d = r.server.dispatcher
    out.single(
        "ringserve_rejected_requests_total",
        "counter",
        "Texts refused at admission (queue standing or full, draining): answered 503.",
        d.rejected,
    )
    out.single(
        "ringserve_queue_wait_seconds",
        "gauge",
        "The queue's measured delay: how long the oldest text waiting in the front-end has "
        "waited (a standing queue past --max-queue-ms for 200 ms is refused).",
        d.wait_ms() / 1000,
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
        "ringserve_dropped_texts_total",
        "counter",
        "Texts dropped before any worker ran them: their client's connection was lost.",
        r.server.dropped,
    )
    out.single(
        "ringserve_failed_requests_total",
        "counter",
        "Texts answered with an error status (timeout, bad input, internal).",
        r.stats.failed,
    )


def timings(out: Exposition, s: Stats, buckets: tuple[int, ...], models: dict[str, str]) -> None:
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
        if models and name == "ringserve_request_latency_seconds":
            latency_by_model(out, s, buckets, models, help_text)
            continue
        out.family(name, "histogram", help_text + " Label bucket: the length bucket (tokens).")
        for b, length in enumerate(buckets):
            out.histogram(
                name,
                {"bucket": str(length)},
                PROM_BOUNDS_S,
                prom_buckets(bins[b]),
                sums[name][b] * scale,
            )


def latency_by_model(
    out: Exposition, s: Stats, buckets: tuple[int, ...], models: dict[str, str], help_text: str
) -> None:
    name = "ringserve_request_latency_seconds"
    out.family(
        name,
        "histogram",
        help_text + " Labels bucket: the length bucket (tokens); model: the model's name.",
    )
    for key, label in sorted(models.items(), key=lambda kv: kv[1]):
        ms = s.for_model(key)
        for b, length in enumerate(buckets):
            out.histogram(
                name,
                {"bucket": str(length), "model": label},
                PROM_BOUNDS_S,
                prom_buckets(ms.lat[b]),
                ms.lat_sum_ns[b] * 1e-9,
            )


def queue(out: Exposition, r: Reading) -> None:
    d = r.server.dispatcher
    gauges = (
        (
            "ringserve_queue_depth",
            "Texts admitted and not yet answered (bounded by --max-queue).",
            d.depth,
        ),
        ("ringserve_queue_limit", "The --max-queue limit.", d.max_queue),
        ("ringserve_inflight", "Texts handed to a worker, not answered.", r.inflight),
        ("ringserve_waiting", "Texts admitted but not yet in a worker's ring.", len(d.waiting)),
        (
            "ringserve_overloaded",
            "1 while the server is refusing requests for lack of queue room.",
            int(r.overloaded),
        ),
    )
    for name, help_text, value in gauges:
        out.single(name, "gauge", help_text, value)


def model_queues(out: Exposition, server: MetricsView, models: dict[str, str]) -> None:
    """With many models: each model's queue, its limit and its refusals (lanes of one name,
    an old and a new version, are added up)."""
    if not models:
        return
    d = server.dispatcher
    depth: dict[str, int] = {}
    limit: dict[str, int] = {}
    refused: dict[str, int] = {}
    for lane in d.models.values():
        label = models.get(lane.name, lane.name)
        depth[label] = depth.get(label, 0) + lane.depth
        refused[label] = refused.get(label, 0) + lane.rejected
        if lane.open:
            limit[label] = lane.max_queue or d.max_queue
    families = (
        ("ringserve_model_queue_depth", "gauge", "Texts admitted and not yet answered.", depth),
        ("ringserve_model_queue_limit", "gauge", "The model's queue limit (open models).", limit),
        (
            "ringserve_model_rejected_requests_total",
            "counter",
            "Texts refused at admission for lack of the model's queue room (503).",
            refused,
        ),
    )
    for name, kind, help_text, values in families:
        rows = (({"model": m}, v) for m, v in sorted(values.items()))
        out.labelled(name, kind, help_text + " Label model: the model's name.", rows)


def server_facts(out: Exposition, server: MetricsView) -> None:
    conns = len(server.http_state.connections) if server.http_state is not None else 0
    uptime = time.monotonic() - server.started
    out.single("ringserve_draining", "gauge", "1 while the server drains.", int(server.draining))
    out.single("ringserve_uptime_seconds", "gauge", "Seconds since start.", uptime)
    out.single("ringserve_http_connections", "gauge", "Open HTTP connections.", conns)
    m = server.model.manifest
    info = {"name": m.name, "fingerprint": m.fingerprint, "device": server.model.device}
    out.labelled("ringserve_model_info", "gauge", "The model being served.", [(info, 1)])


def cache(out: Exposition, answers: AnswerCache) -> None:
    """The answer cache (--cache-bytes; service/engine/cache.py)."""
    c = answers.counts
    out.single("ringserve_cache_hits_total", "counter", "Texts answered from the cache.", c.hits)
    out.single(
        "ringserve_cache_misses_total", "counter", "Texts looked up and not found.", c.misses
    )
    out.single(
        "ringserve_cache_evictions_total",
        "counter",
        "Entries pushed out, least recently used first, to stay within --cache-bytes.",
        c.evictions,
    )
    out.single(
        "ringserve_cache_dropped_total",
        "counter",
        "Entries dropped because their model was reloaded or unloaded.",
        c.dropped,
    )
    out.single("ringserve_cache_bytes", "gauge", "Bytes the cache's entries hold.", answers.bytes)
    out.single(
        "ringserve_cache_capacity_bytes", "gauge", "--cache-bytes (0: off).", answers.capacity
    )
    out.single("ringserve_cache_entries", "gauge", "Texts held.", len(answers.entries))


def slots(out: Exposition, pool: PoolView) -> None:
    """Per worker slot (stable ids): whether it serves, and how often it was replaced."""
    ids = sorted(set(range(pool.target)) | set(pool.slots) | set(pool.restarts))
    serving = {s for s, h in pool.slots.items() if h is not None and h.serving()}
    out.labelled(
        "ringserve_worker_up",
        "gauge",
        "1 when the worker slot has a process serving requests.",
        (({"worker": str(s)}, int(s in serving)) for s in ids),
    )
    out.labelled(
        "ringserve_worker_restarts_total",
        "counter",
        "Times the worker slot's process was replaced (crash, hang, restart, recycle).",
        (({"worker": str(s)}, pool.restarts.get(s, 0)) for s in ids),
    )


def processes(out: Exposition, pool: PoolView) -> None:
    """Per worker process, as the control socket lists them (spares have negative ids)."""
    rows = pool.status_rows()
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
        samples = (({"worker": str(r["id"])}, r[key] * scale) for r in rows if r[key] is not None)
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


# The workers' counters: name, help, WorkerTotals key, scale.
WORKER_COUNTERS = (
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


def worker_counters(
    out: Exposition, totals: list[int], stats: Stats, models: dict[str, str]
) -> None:
    named = WorkerTotals.named(totals)
    bounds = [float(b) for b in L.BATCH_BOUNDS]
    if models:  # a worker counts its models' batches together: each model's, from its answers
        out.family(
            "ringserve_batch_size",
            "histogram",
            "Texts per model batch, all workers; label model: the model's name (its batches as "
            "its answers name them).",
        )
        for key, label in sorted(models.items(), key=lambda kv: kv[1]):
            ms = stats.for_model(key)
            out.histogram(
                "ringserve_batch_size", {"model": label}, bounds, cumulate(ms.batch_hist), ms.rows
            )
    else:
        out.family("ringserve_batch_size", "histogram", "Texts per model batch, all workers.")
        out.histogram(
            "ringserve_batch_size",
            {},
            bounds,
            cumulate(WorkerTotals.batch_hist(totals)),
            named["rows"],  # rows, not answers: a windowed text's windows are rows of batches
        )
    for name, help_text, key, scale in WORKER_COUNTERS:
        value = named[key] * scale if scale != 1 else named[key]
        out.single(name, "counter", help_text, value)


def cumulate(hist: list[int]) -> list[int]:
    """A batch histogram's bins, cumulative, with +Inf last (sizes above the top bound count
    in the top bin)."""
    cumulative = [sum(hist[: i + 1]) for i in range(len(hist))]
    cumulative.append(cumulative[-1])
    return cumulative


def gpus(out: Exposition, pool: PoolView) -> None:
    readings = gpu_readings(pool)
    if not readings:
        return
    per_gpu = (
        ("ringserve_gpu_memory_used_bytes", "GPU memory in use (NVML).", "memory_used_bytes"),
        ("ringserve_gpu_memory_total_bytes", "GPU memory in all (NVML).", "memory_total_bytes"),
        ("ringserve_gpu_utilization_ratio", "GPU busy fraction (NVML), 0 to 1.", "utilization"),
        ("ringserve_gpu_temperature_celsius", "GPU temperature (NVML).", "temperature_c"),
        ("ringserve_gpu_power_watts", "GPU power draw (NVML).", "power_w"),
    )
    for name, help_text, key in per_gpu:  # an unknown reading (None) is left out
        samples = (({"gpu": str(g["index"])}, g[key]) for g in readings if g[key] is not None)
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
                for g in readings
                for w in g["workers"]
            ),
        )
