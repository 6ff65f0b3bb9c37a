"""The one place the front-end enforces a request's deadline: a timer on the event loop that,
while requests are in flight, answers 504 every EXPIRE_EVERY_S for each request whose deadline
passed on the dispatcher's clock, and drops its late answer. (A worker's batcher may still
drop a text that expired before its batch; the front-end answers it here.) The same tick
refuses (503) a text still waiting for a worker past its queue bound (`Request.queue_by_ns`,
service.engine.bounds): it never ran, so it cost no model time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from ringserve.service.engine.answers import Answers
from ringserve.service.engine.lanes import Lines
from ringserve.service.engine.meter import Meter
from ringserve.service.engine.requests import Request, Result
from ringserve.shm import layout as L

EXPIRE_EVERY_S = 0.05
NEVER = 1 << 62  # a deadline past any monotonic clock


class Owed(Protocol):
    """What the dispatcher owes, as expiry reads it (service.engine.dispatcher.Dispatcher)."""

    inflight: dict[int, Request]
    waiting: Lines
    meter: Meter
    clock: Callable[[], int]
    whole: bool  # every slot of the pool has a serving worker
    answers: Answers  # complete()

    def refuse(self, n: int, model: int = 0) -> None: ...


class Expiry:
    def __init__(self, owed: Owed) -> None:
        self.owed = owed
        self.expired = 0  # texts answered 504 here
        self.handle: asyncio.TimerHandle | None = None
        # No deadline in flight passes before this (a bound: texts answered since may have
        # held it), so `due_by` says in O(1) whether a scan can find anything.
        self.soonest_ns = NEVER

    def arm(self, deadline_ns: int = NEVER) -> None:
        """Note a deadline now in flight and start ticking, unless it is already. Only inside
        a running loop: the in-process tests call expire() themselves, with their own clock."""
        self.soonest_ns = min(self.soonest_ns, deadline_ns)
        if self.handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.handle = loop.call_later(EXPIRE_EVERY_S, self.due)

    def due(self) -> None:
        self.handle = None
        self.expire(self.owed.clock())
        if self.owed.inflight:
            self.arm()

    def due_by(self, now_ns: int) -> bool:
        """Whether a deadline in flight may have passed by now (expire() would find one)."""
        return self.soonest_ns <= now_ns

    def expire(self, now_ns: int) -> int:
        """Answer 504 for every request whose deadline passed (their late answers are dropped),
        and 503 for every one still waiting past its queue bound. Returns how many."""
        owed = self.owed
        late, shed, soonest = [], [], NEVER
        for r in owed.inflight.values():
            if r.deadline_ns:
                if r.deadline_ns <= now_ns:
                    late.append(r)
                    continue
                soonest = min(soonest, r.deadline_ns)
            # A death is not overload; a group a worker has started is run whole (shedding the
            # rest would waste what ran and answer the refusal only after it).
            if r.queue_by_ns and not r.group.started and owed.whole:
                if r.queue_by_ns <= now_ns:
                    shed.append(r)
                else:
                    soonest = min(soonest, r.queue_by_ns)
        self.soonest_ns = soonest
        for r in late:
            if r.worker is not None:
                if r.worker.assigned.pop(r.id, None) is not None:
                    owed.meter.released(r.worker, r.cost)
            else:
                with contextlib.suppress(ValueError):
                    owed.waiting.remove(r)
            self.expired += 1
            owed.answers.complete(r, Result(L.STATUS_DEADLINE))
        for r in shed:
            with contextlib.suppress(ValueError):
                owed.waiting.remove(r)
            owed.refuse(1, r.group.model)
            owed.answers.complete(r, Result(L.STATUS_OVERLOADED))
        return len(late) + len(shed)
