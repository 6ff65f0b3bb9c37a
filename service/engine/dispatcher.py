"""Owns every admitted request until it is answered: admission, placement, the workers'
answer doorbells, completion, rerouting and expiry.

What waits, waits here: a worker is given only what it can start soon (about two batches of
work, `hold_cost`, service.engine.routing), so admission, deadlines and every worker see the
queue, and a worker that dies or stalls strands little. Admission bounds the queue by count
(--max-queue, the hard ceiling) and refuses a standing queue: one whose oldest waiting text has
waited past --max-queue-ms for a whole interval, measured on the waiting lines themselves
(service.engine.bounds). The answers come back here too: the dispatcher reads each worker's
answer doorbell, completes the requests, and tells the worker's owner (the supervisor) only
that it became ready or that, draining, it holds nothing any more. A request's deadline is
enforced here alone in the front-end, on a timer on this clock.

Many models: each has a lane (service.engine.lanes) with its own queue limit within the total,
its own waiting lines, flushed round-robin across models, and only workers that hold a model
take its texts (routing.assign). Model 0 is open from the start with the total as its limit,
so a one-model server behaves as it always has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ringserve.service.engine.answers import Answers
from ringserve.service.engine.bounds import FULL, INTERVAL_MS, Free, queue_by, room
from ringserve.service.engine.clients import Client
from ringserve.service.engine.expiry import Expiry
from ringserve.service.engine.lanes import Lane, Lanes, Lines
from ringserve.service.engine.link import WorkerLink
from ringserve.service.engine.meter import Meter
from ringserve.service.engine.requests import (
    BULK,
    INTERACTIVE,
    Group,
    Options,
    Request,
    Result,
    text_cost,
)
from ringserve.service.engine.routing import take_back
from ringserve.shm import layout as L

__all__ = [
    "BULK", "INTERACTIVE", "Dispatcher", "Group", "Options", "Request", "Result", "text_cost",
]  # fmt: skip

log = logging.getLogger("ringserve.dispatcher")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The dispatcher's numbers at one moment, for metrics and /v1/stats."""

    depth: int  # admitted, not yet answered
    max_queue: int
    waiting: int  # of those, not in any worker's ring yet
    waiting_bulk: int
    rejected: int
    expired: int
    wait_ms: float  # the measured delay: how long the oldest waiting text has waited
    max_queue_ms: float
    rate: float | None  # the pool's tokens/s
    answered_by_task: dict[str, int]

    @classmethod
    def of(cls, d: Dispatcher) -> Snapshot:
        return cls(
            d.depth, d.max_queue, len(d.waiting), len(d.waiting.bulk), d.rejected, d.expired,
            d.wait_ms(), d.max_queue_ms, d.rate(), dict(d.answered_by_task),
        )  # fmt: skip


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
        self.waiting = Lines(int(bulk_wait_ms * 1e6))  # admitted, not in any ring yet
        self.table = Lanes()  # the models' lanes (lanes.Lanes: open, close, when_empty)
        self.lanes, self.names = self.table.lanes, self.table.names
        self.models: Mapping[int, Lane] = self.lanes  # the models' lanes, as ops read them
        self.serving: list[WorkerLink] = []  # set_serving(), by the pool
        # Whether every slot of the pool has a serving worker, and since when. While a worker is
        # being replaced the queue's delay says nothing of overload: a request never gets 503
        # merely because its workers died, it waits for their replacements.
        self.whole = True
        self.whole_since_ns = self.clock()
        self.meter = Meter()
        # The workers' doorbells and each request's completion (add, remove, read, complete).
        self.answers = Answers(self.inflight, self.lanes, self.meter, clock, self.refill)
        self.answered_by_task = self.answers.by_task
        self.next_id = 1
        self.accepting = True  # stop_accepting(): the server drains
        self.expiry = Expiry(self)  # deadlines: the one place the front-end enforces them
        self.rejected = 0
        self.why = FULL  # the reason of the last refusal

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
        model: int = 0,
        options: Options = 0,
        client: Client | None = None,
    ) -> Group | None:
        """Admit a group of texts whole (its Group), or refuse it at once (None): see room();
        a model not open refuses uncounted (a 404). `options`: shm.layout OPT_*, one for all or
        one a text; `client`: the connection they came on (engine.clients)."""
        n = len(texts)
        costs = [text_cost(t, self.max_tokens) for t in texts]
        if self.room(n, whole=True, priority=priority, model=model) < n:
            if self.table.is_open(model):
                self.refuse(n, model)
            return None
        return self.admit(texts, costs, deadline_ns, callback, protocol, task, priority, tenant,
                          model, options, client)  # fmt: skip

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
        model: int = 0,
        options: Options = 0,
        client: Client | None = None,
    ) -> Group:
        """Admit texts that room() allowed."""
        lane = self.lanes[model]
        now = self.clock()
        group = Group(len(texts), callback, protocol, now, task, priority, tenant, model, lane.name)
        group.client = client  # counts its texts (Admission) until answered or dropped
        by = queue_by(now, self.delay_ns(model, priority, now) / 1e6, self.max_queue_ms)
        reqs = group.requests(self.next_id, texts, costs, deadline_ns, options)
        self.next_id += len(reqs)
        for r in reqs:
            self.inflight[r.id] = r
            r.queue_by_ns = by
        lane.admitted(len(reqs), sum(costs))
        if priority == BULK:
            lane.bulk_texts += len(reqs)
        if deadline_ns or by:
            self.expiry.arm(min(d for d in (deadline_ns, by) if d))
        self.place(reqs)
        return group

    def room(self, n: int, whole: bool, priority: int = INTERACTIVE, model: int = 0) -> int:
        """How many of n texts, taken in order, may be admitted now (bounds.room).

        Priority: an interactive text's delay is its own line's (it goes before the bulk texts
        waiting in the front-end); bulk texts may fill only lanes.BULK_QUEUE_SHARE of
        --max-queue, so interactive ones always find room. Many models: the model's own limit
        holds as well as the total, and its delay is its own line's, so one model's flood
        refuses only that model's texts."""
        if not self.table.is_open(model):
            self.why = f"unknown model: {self.table.name(model)}"
            return 0
        if not self.accepting:
            self.why = "server is draining"
            return 0
        k, why = self._room(n, whole, priority, model)
        if why is not None and self.expiry.due_by(now := self.clock()) and self.expire(now):
            # Texts whose deadline passed still held room until the expiry timer's next tick
            # (up to EXPIRE_EVERY_S): answered 504 now, they leave it to this request.
            k, why = self._room(n, whole, priority, model)
        if why is not None:
            self.why = why
        return k

    def _room(self, n: int, whole: bool, priority: int, model: int) -> tuple[int, str | None]:
        slots, empty, fits = self.table.free(model, priority, len(self.inflight), self.max_queue)
        now = self.clock()
        delay_ns = self.delay_ns(model, priority, now)
        ahead_ms = None  # only for a queue that is not fresh (Lane.ahead_ms)
        if self.max_queue_ms > 0 and delay_ns >= INTERVAL_MS * 1e6:
            bulk = self.waiting.bulk_cost(model) if priority == INTERACTIVE else 0
            ahead_ms = self.lanes[model].ahead_ms(now, delay_ns, bulk)
        free = Free(slots, empty, fits, delay_ns / 1e6, self.max_queue_ms, ahead_ms)
        return room(n, whole, free)

    def delay_ns(self, model: int = 0, priority: int = INTERACTIVE, now: int = 0) -> int:
        """The queue's measured delay for a new text of this model and priority: how long the
        oldest text it would wait behind has waited in the front-end (0: none waits). While
        the pool is not whole it is 0, and once whole it counts from then."""
        oldest = self.waiting.oldest_ns(model, priority)
        if oldest is None or not self.whole:
            return 0
        return max(0, (now or self.clock()) - max(oldest, self.whole_since_ns))

    def refuse(self, n: int, model: int = 0) -> None:
        """Count texts refused after room() said no (a protocol answers them itself)."""
        self.rejected += n
        lane = self.lanes.get(model)
        if lane is not None:
            lane.rejected += n

    @property
    def many(self) -> bool:
        """More than one model was ever opened: metrics label what they count by model."""
        return len(self.names) > 1

    # -- the pool's speed ---------------------------------------------------------------------
    def rate(self) -> float | None:
        """The pool's cost per second (Meter.rate), None before any worker is measured."""
        return self.meter.rate(self.serving)

    def wait_ms(self) -> float:
        """The queue's measured delay, any model or priority (how long its oldest text waits)."""
        oldest = self.waiting.oldest_of_all()
        return 0.0 if oldest is None else round((self.clock() - oldest) / 1e6, 1)

    # -- the pool and the server ---------------------------------------------------------------
    def stop_accepting(self) -> None:
        """The server drains: every new text is refused (what was admitted is answered)."""
        self.accepting = False

    def set_serving(self, workers: list[WorkerLink], whole: bool) -> None:
        """The workers that take new requests now (the pool calls this whenever its set changes),
        and whether every slot has one: the queue's delay counts only while it does."""
        self.serving = workers
        if whole and not self.whole:
            self.whole_since_ns = self.clock()
        self.whole = whole
        if workers:
            self.flush_waiting()

    # -- placement ------------------------------------------------------------------------------
    def place(self, reqs: list[Request]) -> None:
        self.waiting.place(reqs, self.serving, self.hold_cost, self.meter, self.clock())

    def flush_waiting(self) -> None:
        self.waiting.flush(self.serving, self.hold_cost, self.meter, self.clock())

    def refill(self) -> None:
        """After a worker's answers: what waits goes to the room they left."""
        if self.waiting:
            self.flush_waiting()

    # -- failure ------------------------------------------------------------------------------
    def reroute(self, worker: WorkerLink) -> int:
        """A worker died or hung: what it answered before still counts; every request it held
        goes back to the front, in order. Returns how many moved."""
        try:
            self.answers.read(worker)
        except Exception:
            log.exception("reading the answers of a dead worker")
        moved = take_back(worker)
        self.meter.forget(worker)
        if moved:
            self.waiting.push_front(moved)
            self.flush_waiting()
        return len(moved)

    def expire(self, now_ns: int) -> int:
        """Answer 504 for every request whose deadline passed (expiry.Expiry, on its timer)."""
        return self.expiry.expire(now_ns)

    @property
    def expired(self) -> int:
        return self.expiry.expired

    def fail_all(self, status: int = L.STATUS_INTERNAL) -> None:
        for r in list(self.inflight.values()):
            self.answers.complete(r, Result(status))
        self.waiting.clear()

    # -- views ----------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self.inflight)
