"""The workers' answers: each worker's answer doorbell, reading its response ring, and each
request's completion (Answers). A worker's answers are read when its eventfd rings, and the
worker's owner (the pool) is told three things only: the worker's first ring after boot (it is
ready), a draining worker that holds nothing any more, and a worker that wrote something that
cannot be true (faulty).

Nothing a worker writes is trusted: its ring's tail and records (shm/ring.py), each answer's
form (shm/layout.py response_problem) and its fit to the request it answers and that model's
shape (answer_problem) are all checked before any answer is taken. One that fails is the
worker's fault: nothing of that read is answered, the worker is read no more, and its owner
kills and replaces it and reroutes everything it held, as for any death. The doorbell callback
itself never raises (a request's own callback that does is logged, and the others answered).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ringserve.service.engine.lanes import Lane
from ringserve.service.engine.link import WorkerLink
from ringserve.service.engine.meter import Meter
from ringserve.service.engine.requests import Group, Request, Result
from ringserve.shm import layout as L
from ringserve.shm.ring import RingError
from ringserve.workers.artifact import TASKS

log = logging.getLogger("ringserve.dispatcher")
# The protocol of the texts the pool itself sends a new worker (service/pool/warmup.py): in
# its ring and answered, never admitted (no lane, no meter, not in flight).
WARM_UP = "warm-up"


# The request options whose answers answer_problem knows the shape of (an option added later
# is checked for its form alone, by layout.response_problem, until it is added here).
OPTIONS_SHAPED = L.OPT_MODE | L.OPT_LEFT | L.OPT_EMBED | L.OPT_BULK | L.OPT_BOTH
_UNSHAPED = 0xFF & ~OPTIONS_SHAPED | L.OPT_TOKENS  # token vectors: H floats a token, H not known


class WorkerFault(Exception):
    """What a worker wrote in its response ring cannot be true: the worker is replaced."""


def answer_problem(result: Result, meta: int, lanes: Mapping[int, Lane]) -> str | None:
    """Beyond its form (layout.response_problem): what is wrong with a worker's answer (None:
    nothing) as the answer to the request whose ring record's meta word was `meta`: of the
    kind it asked for, and of its model's shape when the model's lane knows it."""
    if result.status != L.STATUS_OK:
        return None
    options = meta & 0xFF
    if bool(result.flags & L.RSP_TOKENS) != bool(options & L.OPT_TOKENS):
        return "token vectors answered to a text that did not ask for them, or the reverse"
    lane = lanes.get(meta >> L.META_MODEL_SHIFT)
    if options & _UNSHAPED or lane is None or lane.shape is None:
        return None
    if result.flags & (L.RSP_SPARSE | L.RSP_TOKEN_LABELS):  # terms, per-token labels: their
        return None  # own forms (response_problem, workers/token_entities.py)
    labels, dimension = lane.shape
    if options & L.OPT_BOTH:
        want, top = labels + dimension, labels
    elif options & L.OPT_EMBED:
        want, top = dimension, 1
    else:
        want, top = labels, labels
    n = 0 if result.scores is None else len(result.scores)
    if n != want or result.label_id >= max(top, 1):
        return f"{n} floats and label {result.label_id}, where model {lane.name!r} answers {want}"
    return None


def read_answers(
    worker: WorkerLink, read_ns: int, lanes: Mapping[int, Lane]
) -> list[tuple[Request, Result]]:
    """Drain the worker's doorbell and response ring: each answer with the request it answers
    (one no longer assigned to it, rerouted or timed out, is dropped). Raises WorkerFault, with
    no request taken from the worker, when anything it wrote is malformed."""
    worker.eventfd.drain()
    try:
        records = worker.responses.read()
    except RingError as exc:
        raise WorkerFault(str(exc)) from None
    assigned = worker.assigned
    taken: list[tuple[int, Request, Result]] = []
    for msg_id, aux, _meta, payload in records:
        req = assigned.get(msg_id)
        why = L.response_problem(payload)
        if why is None and req is not None:  # one not assigned (rerouted, late): nobody reads it
            try:
                result = Result.from_ring(aux, payload, read_ns)
            except (ValueError, struct.error) as exc:  # what the checks above cannot see
                why = str(exc)
            else:
                why = answer_problem(result, req.meta, lanes)
                taken.append((msg_id, req, result))
        if why is not None:
            raise WorkerFault(f"answer to message {msg_id}: {why}")
    return [(req, result) for msg_id, req, result in taken if assigned.pop(msg_id, None)]


class Owner(Protocol):
    """Who started a worker (the supervisor), as the dispatcher tells it about one."""

    def worker_ready(self, worker: WorkerLink) -> None: ...  # its first answer doorbell

    def worker_drained(self, worker: WorkerLink) -> None: ...  # draining, holding nothing

    def worker_faulty(self, worker: WorkerLink, reason: str) -> None: ...  # wrote a lie


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
        self.faulty: set[WorkerLink] = set()  # found lying: read no more, until removed

    def add(self, worker: WorkerLink, loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
        self.readers[worker] = Reader(loop, owner)
        loop.add_reader(worker.eventfd.fd, self.rang, worker)

    def remove(self, worker: WorkerLink) -> None:
        reader = self.readers.pop(worker, None)
        if reader is not None:
            reader.loop.remove_reader(worker.eventfd.fd)

    def forget(self, worker: WorkerLink) -> None:
        """The worker left the pool."""
        self.remove(worker)
        self.faulty.discard(worker)

    def rang(self, worker: WorkerLink) -> None:
        """The loop's reader callback: never raises."""
        reader = self.readers.get(worker)
        if worker.gone or worker in self.faulty or reader is None:
            return
        try:
            if not reader.ready and worker.loaded():  # its first ring after boot: it is ready
                reader.ready = True
                reader.owner.worker_ready(worker)
            self.on_answers(worker)
            if worker.draining and not worker.assigned:
                reader.owner.worker_drained(worker)
        except WorkerFault as exc:
            self.condemn(worker, reader, str(exc))
        except Exception:  # ours, not the worker's: said, and the loop goes on
            log.exception("reading the answers of worker %d", worker.serial)

    def condemn(self, worker: WorkerLink, reader: Reader, reason: str) -> None:
        """The worker lied: read it no more, and have its owner replace it."""
        self.faulty.add(worker)
        self.remove(worker)
        try:
            reader.owner.worker_faulty(worker, reason)
        except Exception:  # the loop goes on; the watch still sees it
            log.exception("replacing faulty worker %d", worker.serial)


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
        self.by_task = dict.fromkeys(TASKS, 0)

    def add(self, worker: WorkerLink, loop: asyncio.AbstractEventLoop, owner: Owner) -> None:
        """Read the worker's answers whenever its answer doorbell rings."""
        self.doorbells.add(worker, loop, owner)

    def remove(self, worker: WorkerLink) -> None:
        """Stop reading the worker's doorbell and drop its meter (it left the pool)."""
        self.doorbells.forget(worker)
        self.meter.forget(worker)

    def read(self, worker: WorkerLink) -> None:
        """The worker's eventfd fired: drain its response ring, complete what it answered.
        Raises WorkerFault (having taken nothing) when it wrote something malformed; reads
        nothing of a worker found faulty before."""
        if worker in self.doorbells.faulty:
            return
        answered = 0
        now = self.clock()
        for req, result in read_answers(worker, now, self.lanes):
            if req.group.protocol == WARM_UP:
                self.settle(req.group, req.index, result)
                continue
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
        if self.on_result is not None:
            self.on_result(group, result, self.clock() - group.admitted_ns)
        if self.settle(group, req.index, result):
            self.by_task[group.task] += len(group.results)
            if group.client is not None:  # called back already (settle): its texts are done
                group.client.answered(len(group.results))
            if self.on_group is not None:
                self.on_group(group, self.clock())

    @staticmethod
    def settle(group: Group, index: int, result: Result) -> bool:
        """Keep one text's answer; once it is the group's last, call the group back (True)."""
        group.results[index] = result
        group.remaining -= 1
        if group.remaining:
            return False
        try:
            group.callback(group.results)  # type: ignore[arg-type]
        except Exception:  # one reply's defect must not cost the others theirs
            log.exception("answering a %s request", group.protocol)
        return True
