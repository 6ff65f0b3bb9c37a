"""Owns every admitted request until it is answered: admission, placement, answers, rerouting.

A request is one text. A client call with N texts is a Group of N requests answered by one
callback once the last answer is in, so a batch costs one pass through the loop, not N.

What waits, waits here: a worker is given only what it can start soon (about two batches of
work, `hold_cost`), so admission, deadlines and every worker see the queue, and a worker that
dies or stalls strands little. Admission bounds the queue by count (--max-queue) and by time
(--max-queue-ms): the queued work, in estimated tokens, over the pool's measured tokens/s.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from ringserve.service.pool.handle import WorkerHandle
from ringserve.shm import layout as L

# A text's cost in token-equivalents, estimated from its bytes before any tokenizer has seen it:
# about four bytes a token, plus a row's fixed share of a batch (special tokens, per-row work).
BYTES_PER_TOKEN = 4
ROW_COST = 8
RATE_SAMPLE_NS = 200_000_000  # a worker's busy time per throughput sample
RATE_WEIGHT_NS = 1_000_000_000  # a sample of this much busy time moves the estimate halfway
# The estimate is corrected by what it promised: a text answered later than LATE_AT x
# --max-queue-ms after its admission tightens the bound by LATE_STEP, one in time relaxes it by
# ON_TIME_STEP, so under a steady overload about 1% are late (ln(1/0.97) = 0.0305 is 100 x
# 0.0003): the P99 holds. LATE_AT leaves a tenth to what the front-end does before admission and
# after the answer (parsing, refusing, writing): measured ~100 ms at 5x overload (README).
# The correction lasts as long as the backlog: once nothing is in flight it starts again at 1
# (a stalled worker's late answers would otherwise keep a quiet server tight for thousands of
# answers).
LATE_AT = 0.9
LATE_STEP = 0.97
ON_TIME_STEP = 1.0003
TIGHTEST = 0.5
BACKLOG_SAMPLE_NS = 500_000_000  # wall time of one sample of the pool's rate under a backlog
BACKLOG_FRESH_NS = 2_000_000_000  # a backlog sample this recent is the pool's rate
# Priority (service.tenants): bulk texts may fill the queue only up to this share of
# --max-queue, so interactive texts always find room; and a worker takes bulk work only while it
# holds less than one batch (`bulk_hold`), so an interactive text waits behind one bulk batch
# at most. A bulk text waits behind interactive texts at most `bulk_wait_ns`.
BULK_QUEUE_SHARE = 0.75
INTERACTIVE = 0
BULK = 1


def text_cost(payload: bytes, max_tokens: int) -> int:
    return min(max_tokens, len(payload) // BYTES_PER_TOKEN) + ROW_COST


@dataclass(slots=True)
class Result:
    status: int  # shm.layout.STATUS_*
    label_id: int = 0
    scores: np.ndarray | None = None
    bucket: int = 0
    queued_us: int = 0
    model_us: int = 0
    flags: int = 0  # shm.layout.RSP_TRUNCATED, RSP_WINDOWED
    tokens: int = 0  # the text's token count before any cut (STATUS_TOO_LONG: too many)
    windows: int = 0  # windows scored (STATUS_TOO_LONG: windows it would need)
    limit: int = 0  # STATUS_TOO_LONG: max_length, or --max-windows when RSP_WINDOWED
    batch: int = 0  # the batch it ran in, shm.layout.pack_batch (rows, padded length, start)
    read_ns: int = 0  # when the front-end read the answer from its worker's ring


class Group:
    __slots__ = (
        "admitted_ns",
        "callback",
        "priority",
        "protocol",
        "remaining",
        "results",
        "task",
        "tenant",
    )

    def __init__(
        self,
        n: int,
        callback: Callable[[list[Result]], None],
        protocol: str,
        admitted_ns: int,
        task: str = "classify",
        priority: int = INTERACTIVE,
        tenant: str = "",
    ) -> None:
        self.results: list[Result | None] = [None] * n
        self.remaining = n
        self.callback = callback
        self.protocol = protocol
        self.admitted_ns = admitted_ns
        self.task = task  # classify, embed or rerank: what /v1/stats and /metrics count
        self.priority = priority  # INTERACTIVE or BULK (service.tenants)
        self.tenant = tenant  # the caller's tenant name ("" without --api-keys)


class Request:
    __slots__ = ("cost", "deadline_ns", "group", "id", "index", "payload", "rerouted", "worker")

    def __init__(
        self, rid: int, payload: bytes, deadline_ns: int, group: Group, index: int, cost: int
    ):
        self.id = rid
        self.payload = payload
        self.deadline_ns = deadline_ns
        self.group = group
        self.index = index
        self.cost = cost
        self.worker: WorkerHandle | None = None
        self.rerouted = False  # its worker died: its wait says nothing of admission


class Waiting:
    """Admitted texts not yet in any ring, in two lines: interactive texts go first, bulk texts
    behind them, unless the oldest bulk text has waited `max_wait_ns`: then it goes first. So a
    bulk text waits behind interactive ones at most that long (tests/unit/test_clock.py)."""

    __slots__ = ("bulk", "bulk_cost", "interactive", "max_wait_ns")

    def __init__(self, max_wait_ns: int) -> None:
        self.interactive: deque[Request] = deque()
        self.bulk: deque[Request] = deque()
        self.bulk_cost = 0  # of the bulk texts here: interactive texts do not wait for them
        self.max_wait_ns = max_wait_ns

    def __len__(self) -> int:
        return len(self.interactive) + len(self.bulk)

    def __bool__(self) -> bool:
        return bool(self.interactive) or bool(self.bulk)

    def __iter__(self) -> Iterator[Request]:
        yield from self.interactive
        yield from self.bulk

    def extend(self, reqs: Iterable[Request]) -> None:
        for r in reqs:
            if r.group.priority:
                self.bulk.append(r)
                self.bulk_cost += r.cost
            else:
                self.interactive.append(r)

    def push_front(self, reqs: list[Request]) -> None:
        """Put requests back at the front of their lines, in their order."""
        for r in reversed(reqs):
            if r.group.priority:
                self.bulk.appendleft(r)
                self.bulk_cost += r.cost
            else:
                self.interactive.appendleft(r)

    def take(self, n: int, now_ns: int) -> list[Request]:
        """Up to n requests in the order they should go to workers."""
        out: list[Request] = []
        inter, bulk = self.interactive, self.bulk
        while len(out) < n and (inter or bulk):
            if bulk and (not inter or now_ns - bulk[0].group.admitted_ns >= self.max_wait_ns):
                r = bulk.popleft()
                self.bulk_cost -= r.cost
            else:
                r = inter.popleft()
            out.append(r)
        return out

    def remove(self, r: Request) -> None:
        """Raises ValueError when it is not waiting."""
        if r.group.priority:
            self.bulk.remove(r)
            self.bulk_cost -= r.cost
        else:
            self.interactive.remove(r)

    def clear(self) -> None:
        self.interactive.clear()
        self.bulk.clear()
        self.bulk_cost = 0


class Flow:
    """One worker as the dispatcher meters it: the cost it holds, and its measured tokens/s
    while it had work (an idle worker's time says nothing about its speed)."""

    __slots__ = ("busy_ns", "done", "held", "mark_ns", "rate")

    def __init__(self) -> None:
        self.held = 0  # cost of the requests in its ring or batcher
        self.mark_ns = 0  # when the current busy stretch was last accounted (0: idle)
        self.busy_ns = 0  # busy time not yet folded into `rate`
        self.done = 0  # cost answered in that time
        self.rate: float | None = None  # cost per second

    def answered(self, cost: int, now_ns: int) -> None:
        if self.mark_ns:
            self.busy_ns += now_ns - self.mark_ns
        self.done += cost
        self.held -= cost
        self.mark_ns = now_ns if self.held > 0 else 0
        if self.busy_ns >= RATE_SAMPLE_NS:
            sample = self.done * 1e9 / self.busy_ns
            weight = self.busy_ns / (self.busy_ns + RATE_WEIGHT_NS)
            self.rate = sample if self.rate is None else self.rate + (sample - self.rate) * weight
            self.busy_ns = self.done = 0


class Backlog:
    """The pool's answers per wall-clock second while requests waited in the front-end the
    whole time: its real speed under load, with whatever the front-end's own work (parsing,
    refusing, refilling the workers) costs it. Per-worker busy time alone misses the moments a
    worker idles because the front-end has not refilled it yet."""

    __slots__ = ("at_ns", "done", "rate", "start_ns")

    def __init__(self) -> None:
        self.start_ns = 0  # the current window (0: no backlog)
        self.done = 0
        self.rate: float | None = None
        self.at_ns = 0  # when `rate` was last sampled

    def answered(self, cost: int, now_ns: int, backlogged: bool) -> None:
        if not backlogged:
            self.start_ns = 0
            return
        if not self.start_ns:
            self.start_ns, self.done = now_ns, 0
            return
        self.done += cost
        span = now_ns - self.start_ns
        if span >= BACKLOG_SAMPLE_NS:
            sample = self.done * 1e9 / span
            self.rate = sample if self.rate is None else (self.rate + sample) / 2
            self.at_ns = now_ns
            self.start_ns, self.done = now_ns, 0

    def fresh(self, now_ns: int) -> float | None:
        return (
            self.rate if self.rate is not None and now_ns - self.at_ns < BACKLOG_FRESH_NS else None
        )


class Dispatcher:
    def __init__(
        self,
        max_queue: int,
        clock: Callable[[], int] = time.monotonic_ns,
        max_queue_ms: float = 0.0,
        hold_cost: int = 0,
        max_tokens: int = 512,
        bulk_wait_ms: float = 2000.0,
    ) -> None:
        self.max_queue = max_queue
        self.max_queue_ms = max_queue_ms  # 0: no bound by time
        self.hold_cost = hold_cost  # most cost a worker holds at once (0: as its ring takes)
        self.max_tokens = max_tokens  # a text's tokens are cut there: so is its cost
        self.clock = clock  # monotonic ns; tests drive a fake one (deadlines are on it too)
        self.inflight: dict[int, Request] = {}  # admitted, not yet answered
        self.waiting = Waiting(int(bulk_wait_ms * 1e6))  # admitted, not in any ring yet
        self.serving: list[WorkerHandle] = []  # set by the supervisor
        self.flows: dict[WorkerHandle, Flow] = {}
        self.backlog = Backlog()
        self.tighten = 1.0  # the share of the time bound admission uses (see LATE_STEP)
        self.queued_cost = 0  # of everything in flight
        self.next_id = 1
        self.accepting = True
        self.on_result: Callable[[Group, Result, int], None] | None = None  # metrics hook
        self.rejected = 0
        # Texts answered (any status) by task; a rerank counts its documents.
        self.answered_by_task = dict.fromkeys(("classify", "embed", "rerank"), 0)
        self.expired = 0
        self.why = "queue is full"  # the reason of the last refusal

    # -- admission ----------------------------------------------------------------------------
    def submit(
        self,
        texts: list[bytes],
        deadline_ns: int,
        callback: Callable[[list[Result]], None],
        protocol: str = "http",
        task: str = "classify",
        priority: int = INTERACTIVE,
        tenant: str = "",
    ) -> bool:
        """Admit a group of texts whole, or refuse it at once (False): see room()."""
        n = len(texts)
        costs = [text_cost(t, self.max_tokens) for t in texts]
        if self.room(costs, whole=True, priority=priority) < n:
            self.rejected += n
            return False
        self.admit(texts, costs, deadline_ns, callback, protocol, task, priority, tenant)
        return True

    def admit(
        self,
        texts: list[bytes],
        costs: list[int],
        deadline_ns: int,
        callback: Callable[[list[Result]], None],
        protocol: str,
        task: str = "classify",
        priority: int = INTERACTIVE,
        tenant: str = "",
    ) -> None:
        """Admit texts that room() allowed."""
        group = Group(len(texts), callback, protocol, self.clock(), task, priority, tenant)
        if priority == BULK:  # the worker batches interactive texts first too
            texts = [L.with_bulk(t) for t in texts]
        rid = self.next_id
        self.next_id += len(texts)
        reqs = [
            Request(rid + i, t, deadline_ns, group, i, c)
            for i, (t, c) in enumerate(zip(texts, costs, strict=True))
        ]
        for r in reqs:
            self.inflight[r.id] = r
        self.queued_cost += sum(costs)
        self.place(reqs)

    def room(self, costs: list[int], whole: bool, priority: int = INTERACTIVE) -> int:
        """How many of these texts, taken in order, may be admitted now.

        Independent texts (`whole` False: binary frames) are admitted while the queue has a
        slot and its estimated wait is within --max-queue-ms. A request of several texts
        (`whole`) is admitted entire or not at all, and may take at most half of what is free,
        by count and by time, so that one client's big batches cannot fill the queue for the
        rest; into an empty queue it always fits, as long as it fits --max-queue.

        Priority: an interactive text counts only the work it will wait for (not the bulk
        texts waiting in the front-end, which it goes before); bulk texts may fill only
        BULK_QUEUE_SHARE of --max-queue, so interactive ones always find room."""
        n = len(costs)
        if not self.accepting:
            self.why = "server is draining"
            return 0
        free = self.max_queue - len(self.inflight)
        ahead = self.queued_cost
        if priority == BULK:
            free -= self.max_queue - int(self.max_queue * BULK_QUEUE_SHARE)
        else:
            ahead -= self.waiting.bulk_cost
        limit = self.cost_limit()
        if whole and n > 1:
            if not self.inflight:
                return n if n <= self.max_queue else 0
            fits = n <= free // 2
            if fits and limit is not None:
                fits = sum(costs) <= (limit - ahead) / 2
            if not fits:
                self.why = "queue is full: a batch may take at most half of what is free"
            return n if fits else 0
        k = min(n, max(0, free))
        if k < n:
            self.why = "queue is full"
        if limit is not None:
            queued, timed = ahead, 0
            while timed < k and queued <= limit:
                queued += costs[timed]
                timed += 1
            if timed < k:
                self.why = f"queue is full: estimated wait over {self.max_queue_ms:g} ms"
            k = timed
        return k

    def refuse(self, n: int) -> None:
        """Count texts refused after room() said no (a protocol answers them itself)."""
        self.rejected += n

    # -- the pool's speed ---------------------------------------------------------------------
    def rate(self) -> float | None:
        """The pool's cost per second: as measured under a backlog when one is recent, else
        the serving workers' measured rates together (a worker not yet measured counts as the
        mean of those that are). None before any is measured."""
        under_load = self.backlog.fresh(self.clock())
        if under_load is not None:
            return under_load
        workers = self.serving
        rates = [f.rate for w in workers if (f := self.flows.get(w)) and f.rate is not None]
        if not rates:
            return None
        return sum(rates) / len(rates) * len(workers)

    def cost_limit(self) -> float | None:
        """The queued cost that --max-queue-ms allows now, or None (no bound by time)."""
        if self.max_queue_ms <= 0:
            return None
        rate = self.rate()
        return None if rate is None else rate * self.max_queue_ms / 1000 * self.tighten

    def wait_ms(self) -> float | None:
        """The estimated wait of a text admitted now."""
        rate = self.rate()
        return None if not rate else round(self.queued_cost / rate * 1000, 1)

    # -- placement ------------------------------------------------------------------------------
    def place(self, reqs: list[Request]) -> None:
        """Send requests to the least-loaded serving workers; keep the rest waiting, in order."""
        if self.waiting:  # older requests go first
            self.waiting.extend(reqs)
            self.flush_waiting()
            return
        rest = self._assign(reqs)
        self.waiting.extend(rest)

    def flow(self, worker: WorkerHandle) -> Flow:
        f = self.flows.get(worker)
        if f is None:
            f = self.flows[worker] = Flow()
        return f

    def _assign(self, reqs: list[Request]) -> list[Request]:
        """Give each request, in order, to the serving worker holding the least, while one has
        room under `hold_cost` (a worker holding nothing takes any one text); the rest wait."""
        workers = self.serving
        if not workers:
            return reqs
        hold = self.hold_cost
        flows = [self.flow(w) for w in workers]
        loads = [f.held for f in flows]
        by_worker: list[list[Request]] = [[] for _ in workers]
        taken = 0
        for r in reqs:
            k = min(range(len(workers)), key=loads.__getitem__)
            limit = hold // 2 if r.group.priority else hold  # bulk: one batch of the two
            if hold and loads[k] and loads[k] + r.cost > limit:
                break  # the least-loaded worker is full: so is every other
            loads[k] += r.cost
            by_worker[k].append(r)
            taken += 1
        rest = reqs[taken:]
        now = self.clock()
        refused: list[Request] = []
        for w, f, batch in zip(workers, flows, by_worker, strict=True):
            if not batch:
                continue
            n = w.submit([(r.id, r.payload, r.deadline_ns) for r in batch])
            if n and not f.held:
                f.mark_ns = now  # it was idle: its busy time starts now
            for r in batch[:n]:
                r.worker = w
                w.assigned[r.id] = r
                f.held += r.cost
            refused.extend(batch[n:])
        if refused:  # a ring was full: back in the order they were taken in
            order = {id(r): i for i, r in enumerate(reqs)}
            rest = sorted(refused + rest, key=lambda r: order[id(r)])
        return rest

    def flush_waiting(self) -> None:
        """Hand the oldest waiting requests to workers with room, as many as they take."""
        waiting = self.waiting
        if not waiting or not self.serving:
            return
        now = self.clock()
        while waiting:
            chunk = waiting.take(256, now)
            rest = self._assign(chunk)
            if rest:
                waiting.push_front(rest)
                return

    # -- answers --------------------------------------------------------------------------------
    def on_answers(self, worker: WorkerHandle) -> None:
        """The worker's eventfd fired: drain its response ring."""
        worker.eventfd.drain()
        assigned = worker.assigned
        answered = 0
        read_ns = self.clock()
        for msg_id, aux, payload in worker.responses.read():
            req = assigned.pop(msg_id, None)
            if req is None:  # a late answer for a request that was rerouted or timed out
                continue
            answered += req.cost
            status, bucket, label, n, flags, _r, windows, limit, tokens, queued_us, model_us = (
                L.RESPONSE.unpack_from(payload)
            )
            scores = None
            if status == L.STATUS_OK:
                scores = np.frombuffer(payload, dtype="<f4", count=n, offset=L.RESPONSE_SIZE)
            result = Result(
                status, label, scores, bucket, queued_us, model_us, flags, tokens, windows, limit,
                aux, read_ns,
            )  # fmt: skip
            self.complete(req, result)
        if answered:
            now = self.clock()
            self.flow(worker).answered(answered, now)
            self.backlog.answered(answered, now, bool(self.waiting))
        if self.waiting:
            self.flush_waiting()

    def complete(self, req: Request, result: Result) -> None:
        if self.inflight.pop(req.id, None) is None:
            return
        self.queued_cost -= req.cost
        group = req.group
        group.results[req.index] = result
        group.remaining -= 1
        latency_ns = self.clock() - group.admitted_ns
        if self.max_queue_ms > 0 and not req.rerouted:
            if latency_ns > self.max_queue_ms * 1e6 * LATE_AT:
                self.tighten = max(TIGHTEST, self.tighten * LATE_STEP)
            elif self.tighten < 1.0:
                self.tighten = min(1.0, self.tighten * ON_TIME_STEP)
        if not self.inflight:  # the queue ran dry: the correction belonged to that backlog
            self.tighten = 1.0
        if self.on_result is not None:
            self.on_result(group, result, latency_ns)
        if group.remaining == 0:
            self.answered_by_task[group.task] += len(group.results)
            group.callback(group.results)  # type: ignore[arg-type]

    # -- failure ------------------------------------------------------------------------------
    def reroute(self, worker: WorkerHandle) -> int:
        """Move every request a dead or hung worker held back to the front, in order."""
        moved = sorted(worker.assigned.values(), key=lambda r: r.id)
        worker.assigned.clear()
        self.flows.pop(worker, None)
        for r in moved:
            r.worker = None
            r.rerouted = True
        if moved:
            self.waiting.push_front(moved)
            self.flush_waiting()
        return len(moved)

    def forget(self, worker: WorkerHandle) -> None:
        """A worker left the pool for good: drop its meter."""
        self.flows.pop(worker, None)

    def expire(self, now_ns: int) -> int:
        """Answer 504 for every request whose deadline passed; their late answers are dropped."""
        late = [r for r in self.inflight.values() if r.deadline_ns and r.deadline_ns <= now_ns]
        for r in late:
            if r.worker is not None:
                if r.worker.assigned.pop(r.id, None) is not None:
                    f = self.flows.get(r.worker)
                    if f is not None:
                        f.held -= r.cost
                        if f.held <= 0:
                            f.mark_ns = 0
            else:
                with contextlib.suppress(ValueError):
                    self.waiting.remove(r)
            self.expired += 1
            self.complete(r, Result(L.STATUS_DEADLINE))
        return len(late)

    def fail_all(self, status: int = L.STATUS_INTERNAL) -> None:
        for r in list(self.inflight.values()):
            self.complete(r, Result(status))
        self.waiting.clear()

    @property
    def depth(self) -> int:
        return len(self.inflight)
