"""The workers' answers: each worker's answer doorbell, and reading its response ring. The
dispatcher reads a worker's answers when its eventfd rings, and tells the worker's owner (the
supervisor) two things only: the worker's first ring after boot (it is ready), and a draining
worker that holds nothing any more."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from ringserve.service.engine.link import WorkerLink
from ringserve.service.engine.requests import Request, Result


def read_answers(worker: WorkerLink, read_ns: int) -> Iterator[tuple[Request, Result]]:
    """Drain the worker's doorbell and response ring: each answer with the request it answers
    (one no longer assigned to it, rerouted or timed out, is dropped)."""
    worker.eventfd.drain()
    assigned = worker.assigned
    for msg_id, aux, payload in worker.responses.read():
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
