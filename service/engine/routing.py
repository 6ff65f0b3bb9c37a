"""Which worker gets which text: the least-loaded serving worker that holds the text's model,
while it holds less than `hold_cost` (about two batches of work), so what waits, waits in the
front-end."""

from __future__ import annotations

from collections.abc import Sequence

from ringserve.service.engine.meter import Meter
from ringserve.service.engine.requests import Request
from ringserve.service.pool.handle import WorkerHandle


def assign(
    reqs: list[Request], workers: Sequence[WorkerHandle], hold: int, meter: Meter, now_ns: int
) -> list[Request]:
    """Give each request, in order, to the serving worker holding the least among those that
    hold its model (WorkerHandle.models), while one has room under `hold` (a worker holding
    nothing takes any one text); the rest, in order. Once a model's text finds no room, none
    of that model's later texts is placed (none overtakes it); other models' still may be."""
    if not workers:
        return reqs
    flows = [meter.flow(w) for w in workers]
    loads = [f.held for f in flows]
    by_worker: list[list[Request]] = [[] for _ in workers]
    holders: dict[int, list[int]] = {}  # model -> the workers that hold it
    blocked: set[int] = set()  # models whose next text found no room
    rest: list[Request] = []
    for r in reqs:
        m = r.group.model
        ks = holders.get(m)
        if ks is None:
            ks = holders[m] = [k for k, w in enumerate(workers) if m in w.models]
        if m in blocked or not ks:
            rest.append(r)
            continue
        k = min(ks, key=loads.__getitem__)
        limit = hold // 2 if r.group.priority else hold  # bulk: one batch of the two
        if hold and loads[k] and loads[k] + r.cost > limit:
            blocked.add(m)  # its least-loaded worker is full: so is every other
            rest.append(r)
            continue
        loads[k] += r.cost
        by_worker[k].append(r)
    refused: list[Request] = []
    for w, f, batch in zip(workers, flows, by_worker, strict=True):
        if not batch:
            continue
        n = w.submit([(r.id, r.payload, r.deadline_ns) for r in batch])
        if n and not f.held:
            f.mark_ns = now_ns  # it was idle: its busy time starts now
        for r in batch[:n]:
            r.worker = w
            w.assigned[r.id] = r
            f.held += r.cost
        refused.extend(batch[n:])
    if refused:  # a ring was full: back in the order they were taken in
        order = {id(r): i for i, r in enumerate(reqs)}
        rest = sorted(refused + rest, key=lambda r: order[id(r)])
    return rest


def take_back(worker: WorkerHandle) -> list[Request]:
    """Every request a dead or hung worker held, in order, marked as rerouted (its wait then
    says nothing of admission)."""
    moved = sorted(worker.assigned.values(), key=lambda r: r.id)
    worker.assigned.clear()
    for r in moved:
        r.worker = None
        r.rerouted = True
    return moved
