"""The warm-up a worker of a tentative roll answers before it serves (service/pool/roll.py): one
text for each model it holds, written into its own request ring by the pool (never admitted:
no lane, no queue, no client), and its answers read as any other (engine/answers.py, which
checks their form and shape). All answered OK: it may take a place. Anything else (an error
status, no answer within WARM_UP_TIMEOUT_S, a death first) fails the roll, and the models
served before it keep serving."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ringserve.service.engine.answers import WARM_UP
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.engine.requests import Group, Request, Result
from ringserve.service.pool.handle import WorkerHandle
from ringserve.service.pool.roll import Rolls
from ringserve.service.pool.roster import Roster
from ringserve.shm import layout as L

WARM_UP_TEXT = b"ringserve warm-up: one short sentence through the whole model."
# A first batch on a loaded worker takes milliseconds to a few seconds (a cold CUDA graph); a
# busy two-core machine can take more. Past this, the worker is taken as unable to serve.
WARM_UP_TIMEOUT_S = 60.0
STATUS_NAMES = {
    L.STATUS_BAD_REQUEST: "bad request",
    L.STATUS_OVERLOADED: "overloaded",
    L.STATUS_DEADLINE: "deadline",
    L.STATUS_INTERNAL: "internal error",
    L.STATUS_UNKNOWN_MODEL: "unknown model",
    L.STATUS_TOO_LONG: "too long",
}


@dataclass(slots=True)
class Pending:
    handle: WorkerHandle
    deadline: float
    ids: list[int]


class Warmups:
    def __init__(
        self,
        dispatcher: Dispatcher,
        clock: Callable[[], float],
        rolls: Rolls,
        roster: Roster,
        gone: Callable[[WorkerHandle, str], None],
    ) -> None:
        self.dispatcher = dispatcher
        self.clock = clock
        self.rolls = rolls  # whose `warm` a worker joins once it answered
        self.roster = roster  # told, so the dispatcher sends it texts
        self.gone = gone  # declare it dead: kill, replace, reroute (Supervisor._failed)
        self.pending: dict[int, Pending] = {}  # serial -> its warm-up under way

    def send(self, handle: WorkerHandle) -> None:
        """Write the warm-up texts into the worker's ring (one per model it holds)."""
        d, link = self.dispatcher, handle.link
        models = sorted(link.models)
        group = Group(len(models), lambda results: self.answered(handle, results), WARM_UP, 0)
        reqs = []
        for i, index in enumerate(models):
            lane = d.lanes.get(index)
            options = lane.warm if lane is not None else 0  # an ask the model answers
            reqs.append(Request(d.next_id, WARM_UP_TEXT, 0, group, i, 0,
                                L.request_meta(options, index)))  # fmt: skip
            d.next_id += 1
        for r in reqs:
            link.assigned[r.id] = r
            r.worker = link
        self.pending[handle.serial] = Pending(
            handle, self.clock() + WARM_UP_TIMEOUT_S, [r.id for r in reqs]
        )
        if link.submit([(r.id, r.payload, 0, r.meta) for r in reqs]) < len(reqs):
            self.give_up(handle, "its request ring had no room for the warm-up")

    def answered(self, handle: WorkerHandle, results: list[Result]) -> None:
        if self.pending.pop(handle.serial, None) is None:
            return
        bad = [STATUS_NAMES.get(r.status, str(r.status)) for r in results if r.status != 0]
        if bad:
            self.failed(handle, f"its warm-up was answered {', '.join(bad)}")
            return
        self.rolls.warm.add(handle.serial)
        self.roster.emit("worker_warm", worker=handle.slot, pid=handle.pid)
        self.roster.update_serving()

    def failed(self, handle: WorkerHandle, reason: str) -> None:
        """It cannot serve the roll's models: the roll fails, and the worker goes."""
        self.roster.emit("worker_cold", level=logging.WARNING, worker=handle.slot,
                         pid=handle.pid, reason=reason)  # fmt: skip
        self.rolls.fail(handle.generation, f"a worker of the new models cannot serve: {reason}")
        self.gone(handle, f"warm-up failed: {reason}")

    def check(self, now: float) -> None:
        """Fail a warm-up not answered in time."""
        for serial, p in list(self.pending.items()):
            if now > p.deadline and serial in self.pending:
                self.give_up(p.handle, f"no warm-up answer in {WARM_UP_TIMEOUT_S:.0f} s")

    def give_up(self, handle: WorkerHandle, reason: str) -> None:
        self.forget(handle)
        self.failed(handle, reason)

    def forget(self, handle: WorkerHandle) -> None:
        """The worker goes (or failed): its warm-up texts are nobody's to reroute."""
        p = self.pending.pop(handle.serial, None)
        if p is not None:
            for msg_id in p.ids:
                handle.link.assigned.pop(msg_id, None)
