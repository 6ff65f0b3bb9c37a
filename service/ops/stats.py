"""What the front-end counts for operators: every answer written (requests_total), per-request
latency bins, last-minute windows, worker counters read from the control blocks, GPU readings
and overload episodes.

Per request (Stats.observe, on the event loop, once per answered text) the cost is one bisect per
timing and a few integer additions; no locks, since everything runs on the loop's thread.
Everything else (percentiles, totals, rendering) is computed when someone asks.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections import deque
from operator import add
from typing import TYPE_CHECKING, Any

from ringserve.shm import layout as L

if TYPE_CHECKING:
    from ringserve.service.engine.dispatcher import Group, Result
    from ringserve.service.engine.tenants import KeyRing, Tenant
    from ringserve.service.logs import EventLog
    from ringserve.service.ops.views import PoolView, QueueView
    from ringserve.service.pool.handle import WorkerHandle


def _fine_edges_us() -> tuple[int, ...]:
    """Ten log-spaced bin edges a decade, 10 us to 80 s, plus every Prometheus bound."""
    mantissas = (1.0, 1.25, 1.6, 2.0, 2.5, 3.2, 4.0, 5.0, 6.3, 8.0)
    grid = {round(m * 10**k) for k in range(1, 8) for m in mantissas}
    grid.update(round(b * 1e6) for b in PROM_BOUNDS_S)
    return tuple(sorted(grid))


# Prometheus histogram bounds (seconds) for latency, queue wait and model time. Each is also a
# fine edge, so one bisect over the fine edges serves both the exporter and the windows.
PROM_BOUNDS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
EDGES_US = _fine_edges_us()
EDGES_NS = tuple(e * 1000 for e in EDGES_US)
NBINS = len(EDGES_US) + 1  # the last bin is "above the top edge"
# Fine bin i (values in (EDGES[i-1], EDGES[i]]) lands in Prometheus bucket PROM_OF_FINE[i].
PROM_OF_FINE = tuple(
    bisect_left(PROM_BOUNDS_S, EDGES_US[i] / 1e6) if i < len(EDGES_US) else len(PROM_BOUNDS_S)
    for i in range(NBINS)
)

WINDOW_S = 60  # latency percentiles cover the last minute
RATE_S = 5  # requests_per_s averages over the last few seconds
OVERLOAD_QUIET_S = 2.0  # an overload episode ends after this long without a refusal

# Worker counters summed over every worker process, live or gone (CONTROL_FIELDS names).
WORKER_COUNTERS = (
    "requests",
    "batches",
    "tokens",
    "padded_tokens",
    "busy_ns",
    "expired",
    "bad_requests",
    "fallbacks",
    "rows",
)
NCOUNTERS = len(WORKER_COUNTERS)
SEEN_BATCHES = 256  # a model's most recent batches, each counted once in its batch sizes


class Window:
    """One second of answers: how many, and their latency bins per length bucket."""

    __slots__ = ("failed", "lat", "model_us", "n", "queued_us", "sec")

    def __init__(self, nbuckets: int) -> None:
        self.lat = [[0] * NBINS for _ in range(nbuckets)]
        self.reset(-1)

    def reset(self, sec: int) -> None:
        self.sec = sec
        self.n = 0
        self.failed = 0
        self.queued_us = 0
        self.model_us = 0
        for row in self.lat:
            row[:] = [0] * NBINS


class ModelStats:
    """One model's answers, when a server holds many (the `model` label): latency bins per
    length bucket, the sizes of the batches its answers came from, and one-second windows.

    A worker counts batches for all its models together, so a model's batch sizes are read
    from its answers instead: each answer names its batch (Result.batch: rows, padded length,
    start), and a batch is counted the first time one of its answers is seen. (A windowed
    text's answer names one of its batches: batches of nothing but other windows go uncounted.)
    """

    __slots__ = ("answered", "batch_hist", "lat", "lat_sum_ns", "rows", "seen", "seen_set", "win")

    def __init__(self, nbuckets: int) -> None:
        self.answered = 0  # texts, any status
        self.lat = [[0] * NBINS for _ in range(nbuckets)]
        self.lat_sum_ns = [0] * nbuckets
        self.batch_hist = [0] * len(L.BATCH_BOUNDS)  # as a worker's: the first bound >= size
        self.rows = 0
        self.seen: deque[int] = deque()
        self.seen_set: set[int] = set()
        self.win = [Window(1) for _ in range(WINDOW_S)]  # latency over every bucket

    def window(self, sec: int) -> Window:
        w = self.win[sec % WINDOW_S]
        if w.sec != sec:
            w.reset(sec)
        return w

    def batch(self, result: Result) -> None:
        word = result.batch
        if word in self.seen_set:
            return
        if len(self.seen) >= SEEN_BATCHES:
            self.seen_set.discard(self.seen.popleft())
        self.seen.append(word)
        self.seen_set.add(word)
        rows = L.unpack_batch(word, result.read_ns)[0]
        self.batch_hist[min(bisect_left(L.BATCH_BOUNDS, rows), len(L.BATCH_BOUNDS) - 1)] += 1
        self.rows += rows

    def recent(self, now_sec: int, span: int) -> list[Window]:
        lo = now_sec - span
        return [w for w in self.win if lo < w.sec <= now_sec]


def percentile(counts: list[int], q: float) -> float | None:
    """The q-quantile (ms) of binned samples, interpolated linearly inside its bin."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i >= len(EDGES_US):
                return EDGES_US[-1] / 1000
            lo = EDGES_US[i - 1] if i else 0
            frac = (rank - seen) / c
            return (lo + frac * (EDGES_US[i] - lo)) / 1000
        seen += c
    return EDGES_US[-1] / 1000


class Stats:
    """Answers and request timings: every answer written, by protocol, code and tenant
    (`count`, called only where answers are written); cumulative timing bins for Prometheus,
    one-second windows for the dashboard (`observe`, the dispatcher's on_result)."""

    def __init__(self, buckets: tuple[int, ...], keys: KeyRing | None = None) -> None:
        self.keys = keys  # with --api-keys: each tenant's codes too
        # (protocol, code, tenant): tenant is "" without --api-keys, and for answers to no key.
        self.requests_total: dict[tuple[str, int, str], int] = {}
        # Of those, the answers about one model: (protocol, code, tenant, model).
        self.requests_by_model: dict[tuple[str, int, str, str], int] = {}
        self.models: dict[str, ModelStats] = {}  # by model name
        self.buckets = buckets
        nb = self.nb = max(1, len(buckets))
        self.lat = [[0] * NBINS for _ in range(nb)]
        self.queued = [[0] * NBINS for _ in range(nb)]
        self.model = [[0] * NBINS for _ in range(nb)]
        self.lat_sum_ns = [0] * nb
        self.queued_sum_us = [0] * nb
        self.model_sum_us = [0] * nb
        self.failed = 0
        self.windows = [Window(nb) for _ in range(WINDOW_S)]
        self.started_ns = time.monotonic_ns()
        self.cur_sec = self.started_ns // 1_000_000_000
        self.cur = self.windows[self.cur_sec % WINDOW_S]
        self.cur.reset(self.cur_sec)

    # -- per request: keep it a handful of integer operations --------------------------------
    def count(
        self, protocol: str, code: int, n: int = 1, tenant: Tenant | None = None, model: str = ""
    ) -> None:
        """One more answer written (n more); `model`: the model's name, when it was about one."""
        name = ""
        if tenant is not None and self.keys is not None and self.keys.named:
            name = tenant.name
            by = self.keys.counts(name).codes.setdefault(protocol, {})
            by[code] = by.get(code, 0) + n
        key = (protocol, code, name)
        self.requests_total[key] = self.requests_total.get(key, 0) + n
        if model:
            mkey = (protocol, code, name, model)
            self.requests_by_model[mkey] = self.requests_by_model.get(mkey, 0) + n

    def for_model(self, name: str) -> ModelStats:
        ms = self.models.get(name)
        if ms is None:
            ms = self.models[name] = ModelStats(self.nb)
        return ms

    def observe(self, group: Group, result: Result, latency_ns: int) -> None:
        cur = self.cur
        cur.n += 1
        if group is not None and group.model_name:  # a named model: its numbers too
            self.observe_model(group.model_name, result, latency_ns)
        if result.status:  # not answered by a model: no bucket, no timings
            self.failed += 1
            cur.failed += 1
            return
        b = result.bucket
        if b >= self.nb:  # read from shared memory: never trust it as an index
            b = self.nb - 1
        i = bisect_left(EDGES_NS, latency_ns)
        self.lat[b][i] += 1
        cur.lat[b][i] += 1
        self.lat_sum_ns[b] += latency_ns
        q = result.queued_us
        m = result.model_us
        self.queued[b][bisect_left(EDGES_US, q)] += 1
        self.model[b][bisect_left(EDGES_US, m)] += 1
        self.queued_sum_us[b] += q
        self.model_sum_us[b] += m
        cur.queued_us += q
        cur.model_us += m

    def observe_model(self, name: str, result: Result, latency_ns: int) -> None:
        """One answer about a named model (the dispatcher's first model is unnamed until it is
        opened by name: a one-model server's numbers are the totals)."""
        ms = self.for_model(name)
        ms.answered += 1
        mine = ms.window(self.cur_sec)
        mine.n += 1
        if result.status:
            mine.failed += 1
            return
        b = min(result.bucket, self.nb - 1)
        i = bisect_left(EDGES_NS, latency_ns)
        ms.lat[b][i] += 1
        ms.lat_sum_ns[b] += latency_ns
        mine.lat[0][i] += 1
        if result.batch:
            ms.batch(result)

    # -- on the tick --------------------------------------------------------------------------
    def rotate(self, now_ns: int) -> None:
        """Start a new window when the second changes, clearing any seconds skipped."""
        sec = now_ns // 1_000_000_000
        if sec <= self.cur_sec:
            return
        for s in range(max(self.cur_sec + 1, sec - WINDOW_S + 1), sec + 1):
            self.windows[s % WINDOW_S].reset(s)
        self.cur_sec = sec
        self.cur = self.windows[sec % WINDOW_S]

    # -- views --------------------------------------------------------------------------------
    def recent(self, span: int = WINDOW_S) -> list[Window]:
        lo = self.cur_sec - span
        return [w for w in self.windows if lo < w.sec <= self.cur_sec]

    def requests_per_s(self, now_ns: int) -> float:
        """Answers a second over the last RATE_S seconds (the current one counted in part)."""
        count = sum(w.n for w in self.recent(RATE_S))
        elapsed = (RATE_S - 1) + (now_ns - self.cur_sec * 1_000_000_000) / 1e9
        elapsed = min(elapsed, (now_ns - self.started_ns) / 1e9)
        return round(count / elapsed, 2) if elapsed > 0.05 else 0.0

    def model_minute(self, name: str, now_ns: int) -> dict[str, Any]:
        """One model's numbers for /v1/stats: texts answered (any status), a second over the
        last RATE_S seconds, and its latency percentiles over the last minute."""
        ms = self.for_model(name)
        count = sum(w.n for w in ms.recent(self.cur_sec, RATE_S))
        elapsed = (RATE_S - 1) + (now_ns - self.cur_sec * 1_000_000_000) / 1e9
        elapsed = min(elapsed, (now_ns - self.started_ns) / 1e9)
        merged = [0] * NBINS
        for w in ms.recent(self.cur_sec, WINDOW_S):
            if w.n > w.failed:
                merged = list(map(add, merged, w.lat[0]))
        rate = round(count / elapsed, 2) if elapsed > 0.05 else 0.0
        return {"requests": ms.answered, "requests_per_s": rate, "latency_ms": quantiles(merged)}

    def overall_minute(self, answered: int, now_ns: int) -> dict[str, Any]:
        """model_minute's numbers over every answer (a one-model server's unnamed model)."""
        merged = [0] * NBINS
        for w in self.recent():
            if w.n > w.failed:
                for row in w.lat:
                    merged = list(map(add, merged, row))
        return {
            "requests": answered,
            "requests_per_s": self.requests_per_s(now_ns),
            "latency_ms": quantiles(merged),
        }

    def history(self) -> list[int]:
        """Answers in each of the last WINDOW_S whole seconds, oldest first."""
        by_sec = {w.sec: w.n for w in self.windows}
        return [by_sec.get(s, 0) for s in range(self.cur_sec - WINDOW_S, self.cur_sec)]

    def last_minute(self) -> dict[str, Any]:
        wins = self.recent()
        per_bucket: dict[str, Any] = {}
        merged_all = [0] * NBINS
        busy = [w for w in wins if w.n > w.failed]  # most seconds of a quiet server are empty
        for b, length in enumerate(self.buckets):
            merged = [0] * NBINS
            for w in busy:
                merged = list(map(add, merged, w.lat[b]))
            merged_all = list(map(add, merged_all, merged))
            p50, p99 = percentile(merged, 0.5), percentile(merged, 0.99)
            per_bucket[str(length)] = {
                "p50": None if p50 is None else round(p50, 3),
                "p99": None if p99 is None else round(p99, 3),
                "count": sum(merged),
            }
        answered = sum(w.n - w.failed for w in wins)
        return {
            "latency_ms": per_bucket,
            "latency_histogram": {
                "bounds_ms": [e / 1000 for e in EDGES_US] + [None],
                "counts": merged_all,
            },
            "time_ms": {
                "queued": round(sum(w.queued_us for w in wins) / answered / 1000, 3)
                if answered
                else None,
                "model": round(sum(w.model_us for w in wins) / answered / 1000, 3)
                if answered
                else None,
            },
            "failed": sum(w.failed for w in wins),
        }


def quantiles(counts: list[int]) -> dict[str, float | None]:
    """p50 and p99 (ms) of binned samples, None without any."""
    p50, p99 = percentile(counts, 0.5), percentile(counts, 0.99)
    return {
        "p50": None if p50 is None else round(p50, 3),
        "p99": None if p99 is None else round(p99, 3),
    }


def prom_buckets(fine: list[int]) -> list[int]:
    """Fine bins to cumulative Prometheus bucket counts (the last one is +Inf)."""
    out = [0] * (len(PROM_BOUNDS_S) + 1)
    for i, c in enumerate(fine):
        if c:
            out[PROM_OF_FINE[i]] += c
    for i in range(1, len(out)):
        out[i] += out[i - 1]
    return out


def read_counters(handle: WorkerHandle) -> list[int]:
    """A worker's counters and batch histogram, as one flat list (monotonic per process)."""
    ctl = handle.ctl
    return [max(0, ctl.get(name)) for name in WORKER_COUNTERS] + [
        max(0, c) for c in ctl.batch_histogram()
    ]


class WorkerTotals:
    """Worker counters summed over live and retired processes, so totals never go backwards.

    Each process's counters are kept as last seen (by its serial); when it is released, what it
    counted moves into `retired`, and into its slot's `by_slot`: a slot's totals (`slot_totals`)
    go on across the processes that served it (a restart, or the roll of a model load).
    """

    def __init__(self) -> None:
        width = NCOUNTERS + len(L.BATCH_BOUNDS)
        self.retired = [0] * width
        self.seen: dict[int, list[int]] = {}
        self.slot_of: dict[int, int] = {}  # serial -> the serving slot it held last
        self.by_slot: dict[int, list[int]] = {}  # slot -> its released processes' counts

    def sample(self, handle: WorkerHandle) -> None:
        try:
            now = read_counters(handle)
        except ValueError:  # its control block is already released
            return
        prev = self.seen.get(handle.serial)
        if prev is not None:
            now = [max(a, b) for a, b in zip(prev, now, strict=True)]
        self.seen[handle.serial] = now
        if handle.slot is not None:
            self.slot_of[handle.serial] = handle.slot

    def retire(self, handle: WorkerHandle) -> None:
        """The process is about to be released: keep its final counts."""
        self.sample(handle)
        self.release(handle.serial)

    def release(self, serial: int) -> None:
        last = self.seen.pop(serial, None)
        slot = self.slot_of.pop(serial, None)
        if last is None:
            return
        self.retired = [a + b for a, b in zip(self.retired, last, strict=True)]
        if slot is not None:
            kept = self.by_slot.get(slot, [0] * len(last))
            self.by_slot[slot] = [a + b for a, b in zip(kept, last, strict=True)]

    def slot_totals(self, slot: int) -> list[int]:
        """What every process that served `slot` counted, live ones included."""
        width = len(self.retired)
        totals = list(self.by_slot.get(slot, [0] * width))
        for serial, held in self.slot_of.items():
            if held == slot and serial in self.seen:
                totals = [a + b for a, b in zip(totals, self.seen[serial], strict=True)]
        return totals

    def refresh(self, supervisor: PoolView) -> list[int]:
        """Sample every live worker, retire any that vanished unseen, return the totals."""
        live = supervisor.all
        for handle in list(live.values()):
            self.sample(handle)
        for serial in [s for s in self.seen if s not in live]:
            self.release(serial)
        totals = list(self.retired)
        for counts in self.seen.values():
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
        return totals

    @staticmethod
    def named(totals: list[int]) -> dict[str, int]:
        return dict(zip(WORKER_COUNTERS, totals[:NCOUNTERS], strict=True))

    @staticmethod
    def batch_hist(totals: list[int]) -> list[int]:
        return totals[NCOUNTERS:]


# NVML readings in the control block: (field, unit scale); a worker writes -1 for "unknown".
GPU_FIELDS = {
    "memory_used_bytes": ("gpu_mem_used", 1),
    "memory_total_bytes": ("gpu_mem_total", 1),
    "utilization": ("gpu_util_milli", 1e-3),
    "temperature_c": ("gpu_temp_c", 1),
    "power_w": ("gpu_power_mw", 1e-3),
}


def gpu_readings(supervisor: PoolView) -> list[dict[str, Any]]:
    """One entry per GPU that a live worker reports on (empty when no worker is on CUDA).

    Every worker on a GPU samples the same NVML device, so each reading keeps the largest value
    any of them reports; a reading no worker knows is None.
    """
    gpus: dict[int, dict[str, Any]] = {}
    for handle in list(supervisor.all.values()):
        if handle.dead:
            continue
        try:
            snap = handle.ctl.snapshot()
        except ValueError:  # released meanwhile
            continue
        if snap["device_kind"] != 1:
            continue
        index = snap["gpu_index"]
        entry = gpus.setdefault(index, {"index": index, **dict.fromkeys(GPU_FIELDS), "workers": []})
        for key, (field, scale) in GPU_FIELDS.items():
            raw = snap[field]
            if raw >= 0:
                value = raw * scale if scale != 1 else raw
                entry[key] = value if entry[key] is None else max(entry[key], value)
        entry["workers"].append(
            {
                "id": handle.slot if handle.slot is not None else -handle.serial,
                "pid": handle.pid,
                "cuda_reserved_bytes": snap["cuda_reserved"],
                "cuda_allocated_bytes": snap["cuda_allocated"],
                "fallbacks": snap["fallbacks"],
            }
        )
    return [gpus[k] for k in sorted(gpus)]


CAPTURE_ERRORS = {  # the control block's capture_error word (workers/runtimes/cuda.py)
    1: "out of memory while capturing CUDA graphs: serving eagerly",
    2: "CUDA graph capture failed: serving eagerly (the worker's cuda_graphs_failed log line)",
}


def graph_report(handle: WorkerHandle) -> dict[str, Any]:
    """A GPU worker's CUDA graphs as /v1/stats shows them; a failed capture is never silent."""
    try:
        snap = handle.ctl.snapshot()
    except ValueError:  # released meanwhile
        return {}
    code = snap["capture_error"]
    return {
        "graphs": snap["graphs"],
        "graphs_expected": snap["graphs_expected"],
        "graph_bytes": snap["graph_bytes"],
        "capture_error": CAPTURE_ERRORS.get(code, f"code {code}") if code else None,
    }


class OverloadWatch:
    """Turns refusals into episodes: one event when refusing starts, one when it has stopped."""

    def __init__(self, dispatcher: QueueView, log: EventLog) -> None:
        self.dispatcher = dispatcher
        self.log = log
        self.last_rejected = dispatcher.rejected
        self.active = False
        self.began = 0.0
        self.last_refusal = 0.0
        self.at_start = 0

    def check(self, now: float, draining: bool) -> None:
        rejected = self.dispatcher.rejected
        before = self.last_rejected
        self.last_rejected = rejected
        if rejected > before and not draining:  # a draining server refuses by design
            self.last_refusal = now
            if not self.active:
                self.active = True
                self.began = now
                self.at_start = before
                self.log.emit(
                    "overload_begins",
                    level=logging.WARNING,
                    queue_depth=self.dispatcher.depth,
                    max_queue=self.dispatcher.max_queue,
                )
        elif self.active and (draining or now - self.last_refusal >= OVERLOAD_QUIET_S):
            self.active = False
            self.log.emit(
                "overload_ends",
                level=logging.INFO,
                duration_s=round(self.last_refusal - self.began, 3),
                rejected=rejected - self.at_start,
            )
