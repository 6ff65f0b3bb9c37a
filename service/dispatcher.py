"""Owns every admitted request until it is answered: admission, placement, answers, rerouting.

A request is one text. A client call with N texts is a Group of N requests answered by one
callback once the last answer is in, so a batch costs one pass through the loop, not N.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.pool import WorkerHandle
from shm import layout as L


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


class Group:
    __slots__ = ("admitted_ns", "callback", "protocol", "remaining", "results")

    def __init__(
        self, n: int, callback: Callable[[list[Result]], None], protocol: str, admitted_ns: int
    ) -> None:
        self.results: list[Result | None] = [None] * n
        self.remaining = n
        self.callback = callback
        self.protocol = protocol
        self.admitted_ns = admitted_ns


class Request:
    __slots__ = ("deadline_ns", "group", "id", "index", "payload", "worker")

    def __init__(self, rid: int, payload: bytes, deadline_ns: int, group: Group, index: int):
        self.id = rid
        self.payload = payload
        self.deadline_ns = deadline_ns
        self.group = group
        self.index = index
        self.worker: WorkerHandle | None = None


class Dispatcher:
    def __init__(self, max_queue: int, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.max_queue = max_queue
        self.clock = clock  # monotonic ns; tests drive a fake one (deadlines are on it too)
        self.inflight: dict[int, Request] = {}  # admitted, not yet answered
        self.waiting: deque[Request] = deque()  # admitted, not in any ring yet
        self.serving: list[WorkerHandle] = []  # set by the supervisor
        self.next_id = 1
        self.accepting = True
        self.on_result: Callable[[Group, Result, int], None] | None = None  # metrics hook
        self.rejected = 0
        self.expired = 0

    # -- admission ----------------------------------------------------------------------------
    def submit(
        self,
        texts: list[bytes],
        deadline_ns: int,
        callback: Callable[[list[Result]], None],
        protocol: str = "http",
    ) -> bool:
        """Admit a group of texts, or refuse it at once (False) when the queue is full."""
        n = len(texts)
        if not self.accepting or len(self.inflight) + n > self.max_queue:
            self.rejected += n
            return False
        group = Group(n, callback, protocol, self.clock())
        rid = self.next_id
        self.next_id += n
        reqs = [Request(rid + i, t, deadline_ns, group, i) for i, t in enumerate(texts)]
        for r in reqs:
            self.inflight[r.id] = r
        self.place(reqs)
        return True

    def place(self, reqs: list[Request]) -> None:
        """Send requests to the least-loaded serving workers; keep the rest waiting, in order."""
        if self.waiting:  # older requests go first
            self.waiting.extend(reqs)
            self.flush_waiting()
            return
        rest = self._assign(reqs)
        self.waiting.extend(rest)

    def _assign(self, reqs: list[Request]) -> list[Request]:
        workers = self.serving
        if not workers:
            return reqs
        by_worker: dict[int, list[Request]] = {}
        loads = {id(w): len(w.assigned) for w in workers}
        if len(workers) == 1:
            by_worker[id(workers[0])] = reqs
        else:
            for r in reqs:
                w = min(workers, key=lambda w: loads[id(w)])
                loads[id(w)] += 1
                by_worker.setdefault(id(w), []).append(r)
        rest: list[Request] = []
        for w in workers:
            batch = by_worker.get(id(w))
            if not batch:
                continue
            n = w.submit([(r.id, r.payload, r.deadline_ns) for r in batch])
            for r in batch[:n]:
                r.worker = w
                w.assigned[r.id] = r
            rest.extend(batch[n:])
        rest.sort(key=lambda r: r.id)
        return rest

    def flush_waiting(self) -> None:
        if not self.waiting or not self.serving:
            return
        reqs = list(self.waiting)
        self.waiting.clear()
        self.waiting.extend(self._assign(reqs))

    # -- answers --------------------------------------------------------------------------------
    def on_answers(self, worker: WorkerHandle) -> None:
        """The worker's eventfd fired: drain its response ring."""
        worker.eventfd.drain()
        assigned = worker.assigned
        for msg_id, _aux, payload in worker.responses.read():
            req = assigned.pop(msg_id, None)
            if req is None:  # a late answer for a request that was rerouted or timed out
                continue
            status, bucket, label, n, flags, _r, windows, limit, tokens, queued_us, model_us = (
                L.RESPONSE.unpack_from(payload)
            )
            scores = None
            if status == L.STATUS_OK:
                scores = np.frombuffer(payload, dtype="<f4", count=n, offset=L.RESPONSE_SIZE)
            result = Result(
                status, label, scores, bucket, queued_us, model_us, flags, tokens, windows, limit
            )
            self.complete(req, result)
        if self.waiting:
            self.flush_waiting()

    def complete(self, req: Request, result: Result) -> None:
        if self.inflight.pop(req.id, None) is None:
            return
        group = req.group
        group.results[req.index] = result
        group.remaining -= 1
        if self.on_result is not None:
            self.on_result(group, result, self.clock() - group.admitted_ns)
        if group.remaining == 0:
            group.callback(group.results)  # type: ignore[arg-type]

    # -- failure ------------------------------------------------------------------------------
    def reroute(self, worker: WorkerHandle) -> int:
        """Move every request a dead or hung worker held back to the front, in order."""
        moved = sorted(worker.assigned.values(), key=lambda r: r.id)
        worker.assigned.clear()
        for r in moved:
            r.worker = None
        if moved:
            self.waiting.extendleft(reversed(moved))
            self.flush_waiting()
        return len(moved)

    def expire(self, now_ns: int) -> int:
        """Answer 504 for every request whose deadline passed; their late answers are dropped."""
        late = [r for r in self.inflight.values() if r.deadline_ns and r.deadline_ns <= now_ns]
        for r in late:
            if r.worker is not None:
                r.worker.assigned.pop(r.id, None)
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
