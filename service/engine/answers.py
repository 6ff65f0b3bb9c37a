"""The workers' answers: each worker's answer doorbell, reading its response ring, and each
request's completion (Answers). A worker's answers are read when its eventfd rings, and the
worker's owner (the pool) is told two things only: the worker's first ring after boot (it is
ready), and a draining worker that holds nothing any more."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from ringserve.service.engine.lanes import Lane
from ringserve.service.engine.link import WorkerLink
from ringserve.service.engine.meter import Meter
from ringserve.service.engine.requests import Group, Request, Result


def read_answers(worker: WorkerLink, read_ns: int) -> Iterator[tuple[Request, Result]]:
    """Drain the worker's doorbell and response ring: each answer with the request it answers
    (one no longer assigned to it, rerouted or timed out, is dropped)."""
    worker.eventfd.drain()
    assigned = worker.assigned
    for msg_id, aux, _meta, payload in worker.responses.read():
        req = assigned.pop(msg_id, None)
        if req is not None:
            yield req, Result.from_ring(aux, payload, read_ns)


class Owner(Protocol):
    """Who started a worker (the supervisor), as the dispatcher tells it about one."""

    def worker_ready(self, worker: WorkerLink) -> None: ...  # its first answer doorbell

    def worker_drained(self, worker: WorkerLink) -> None: ...  # draining, holding nothing


@dataclass(slots=True)
class Reader:
    """A worker whose answer doorbell is read."""

    loop: asyncio.AbstractEventLoop
    owner: Owner
    ready: bool = False  # its owner was told it is ready


class Doorbells:
    """Every worker whose answers are read, and what to do when one rings."""

    def __init__(self, on_answers: Callable[[WorkerLink], None]) -> None:
        self.readers: dict[WorkerLink, Reader] = {}
        self.on_answers = on_answers  # Dispatcher.on_answers: read the ring, complete

    def add(self, worker: WorkerLink, loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
        self.readers[worker] = Reader(loop, owner)
        loop.add_reader(worker.eventfd.fd, self.rang, worker)

    def remove(self, worker: WorkerLink) -> None:
        reader = self.readers.pop(worker, None)
        if reader is not None:
            reader.loop.remove_reader(worker.eventfd.fd)

    def rang(self, worker: WorkerLink) -> None:
        reader = self.readers.get(worker)
        if worker.gone or reader is None:
            return
        if not reader.ready and worker.loaded():  # its first ring after boot: it is ready
            reader.ready = True
            reader.owner.worker_ready(worker)
        self.on_answers(worker)
        if worker.draining and not worker.assigned:
            reader.owner.worker_drained(worker)


class Answers:
    """Every admitted request until it is answered: the workers' doorbells, each answer
    matched to its request, a group's callback once its last text is answered, and the counts
    by task. `refill` runs after each worker's answers (the dispatcher places what waits)."""

    def __init__(
        self,
        inflight: dict[int, Request],
        lanes: Mapping[int, Lane],
        meter: Meter,
        clock: Callable[[], int],
        refill: Callable[[], None],
    ) -> None:
        self.inflight, self.lanes, self.meter, self.clock = inflight, lanes, meter, clock
        self.refill = refill
        self.doorbells = Doorbells(self.read)  # the workers whose answers are read here
        self.on_result: Callable[[Group, Result, int], None] | None = None  # metrics hook
        # Once a group's reply is written, with the clock then (ops/inference_stats.py).
        self.on_group: Callable[[Group, int], None] | None = None
        # Texts answered (any status) by task; a rerank counts its documents.
        self.by_task = dict.fromkeys(("classify", "embed", "rerank"), 0)

    def add(self, worker: WorkerLink, loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
        """Read the worker's answers whenever its answer doorbell rings."""
        self.doorbells.add(worker, loop, owner)

    def remove(self, worker: WorkerLink) -> None:
        """Stop reading the worker's doorbell and drop its meter (it left the pool)."""
        self.doorbells.remove(worker)
        self.meter.forget(worker)

    def read(self, worker: WorkerLink) -> None:
        """The worker's eventfd fired: drain its response ring, complete what it answered."""
        answered = 0
        now = self.clock()
        for req, result in read_answers(worker, now):
            answered += req.cost
            lane = self.lanes.get(req.group.model)
            if lane is not None:
                lane.drain.answered(req.cost, now)  # the lane's rate (bounds.Drain)
            self.complete(req, result)
        if answered:
            self.meter.answered(worker, answered, self.clock())
        self.refill()

    def complete(self, req: Request, result: Result) -> None:
        if self.inflight.pop(req.id, None) is None:
            return
        group = req.group
        self.lanes[group.model].answered(req.cost)
        group.results[req.index] = result
        group.remaining -= 1
        if self.on_result is not None:
            self.on_result(group, result, self.clock() - group.admitted_ns)
        if group.remaining == 0:
            self.by_task[group.task] += len(group.results)
            if group.client is not None:
                group.client.answered(len(group.results))
            group.callback(group.results)  # type: ignore[arg-type]
            if self.on_group is not None:
                self.on_group(group, self.clock())
