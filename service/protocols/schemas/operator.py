"""The answers of the probes and the operators' JSON (service/protocols/routes.py's health,
service/ops/metrics.py's /v1/stats) and of the document itself: the document's schemas."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType
from ringserve.service.protocols.schemas import NonNegative


class Live(Struct, forbid_unknown_fields=True):
    """GET /v2/health/live."""

    live: Literal[True]


class Ready(Struct, forbid_unknown_fields=True):
    """GET /v2/health/ready: true with 200, false with 503."""

    ready: bool


class StatsModel(Struct, forbid_unknown_fields=True):
    name: str
    device: str


class LatencyHistogram(Struct, forbid_unknown_fields=True):
    bounds_ms: list[float | None]  # the last bucket's bound is null (+Inf)
    counts: list[NonNegative]


class TimeSplit(Struct, forbid_unknown_fields=True):
    queued: float | None
    model: float | None


Rows = list[dict[str, Any]]  # open rows: a worker's as the control status's (docs/api.md)


class Stats(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """GET /v1/stats (metrics.Metrics.snapshot and stats.Stats.last_minute): its keys closed,
    what is inside the rows open."""

    uptime_s: float
    model: StatsModel
    buckets: list[NonNegative]
    queue_depth: NonNegative
    inflight: NonNegative
    requests_per_s: float
    workers: Rows
    gpus: Rows
    latency_ms: dict[str, Any]
    metrics: bool | UnsetType = UNSET
    draining: bool | UnsetType = UNSET
    overloaded: bool | UnsetType = UNSET
    max_queue: NonNegative | UnsetType = UNSET
    waiting: NonNegative | UnsetType = UNSET
    waiting_bulk: NonNegative | UnsetType = UNSET
    bulk_max_wait_ms: float | UnsetType = UNSET
    queue_wait_ms: float | UnsetType | None = UNSET
    max_queue_ms: float | UnsetType = UNSET
    pool_tokens_per_s: float | UnsetType | None = UNSET
    requests_per_s_history: list[float] | UnsetType = UNSET
    restarts_total: NonNegative | UnsetType = UNSET
    totals: dict[str, Any] | UnsetType = UNSET
    latency_histogram: LatencyHistogram | UnsetType = UNSET
    time_ms: TimeSplit | UnsetType = UNSET
    failed: NonNegative | UnsetType = UNSET
    tenants: Rows | UnsetType = UNSET  # --api-keys: tenants.KeyRing.table
    models: dict[str, dict[str, Any]] | UnsetType = UNSET  # by name (ops/metrics.py)


class OpenAPIDocument(Struct):
    """An OpenAPI 3.1 document (this one): open beyond its three keys."""

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]


def health_answers() -> dict[str, Any]:
    return {
        "live": Live,
        "ready": Ready,
        "stats": Stats,
        "document": OpenAPIDocument,
    }
