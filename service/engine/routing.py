"""Which worker gets which text: the least-loaded serving worker that holds the text's model,
while it holds less than `hold_cost` (about two batches of work), so what waits, waits in the
front-end. Many models: a light model's texts go to one home worker (Homes)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ringserve.service.engine.link import WorkerLink
from ringserve.service.engine.meter import Meter
from ringserve.service.engine.requests import Request

# Many models: a model whose recent work (cost placed, decayed with HOME_HALF_LIFE_NS) is at
# most 1/HOME_RATIO of another model's has a home, the first serving worker that holds it, and
# its texts go there alone, past `hold` up to HOME_HOLD_SHARE times it. Only that worker's Turns
# then sees the light model's texts and shortens the busy model's batches (workers.process.served
# SHORT_SHARE), while the other workers keep whole batches; the light text waits behind one short
# busy batch, not behind the whole one that runs on whichever worker it was sent to. Its home
# goes when it is no longer light, or when the worker leaves `serving` (died, replaced, drained):
# then the next that holds it, or the normal least-loaded choice.
HOME_RATIO = 2.0
HOME_HALF_LIFE_NS = 500_000_000
HOME_HOLD_SHARE = 2


class Homes:
    """Each model's recent placed work, and from it which models are light (on a clock given
    by the caller)."""

    __slots__ = ("mark_ns", "work")

    def __init__(self) -> None:
        self.work: dict[int, float] = {}  # model -> decayed cost placed
        self.mark_ns = 0  # when `work` was last decayed

    def decay(self, now_ns: int) -> None:
        dt = now_ns - self.mark_ns
        if dt > 0:
            f = math.exp2(-dt / HOME_HALF_LIFE_NS)
            work = self.work
            for m in work:  # in place: this runs at every placement
                work[m] *= f
            self.mark_ns = now_ns

    def placed(self, model: int, cost: int) -> None:
        self.work[model] = self.work.get(model, 0.0) + cost

    def light(self, now_ns: int) -> set[int]:
        """The models with recent work at most 1/HOME_RATIO of the busiest's (never one alone:
        with one model nothing is light)."""
        self.decay(now_ns)
        if len(self.work) < 2:
            return set()
        top = max(self.work.values())
        return {m for m, w in self.work.items() if w * HOME_RATIO <= top}

    def unseen(self, model: int) -> bool:
        """A model that placed nothing yet beside one that did: its first text is light too, so
        it goes home and no other worker's Turns shortens its busy batches for it."""
        return model not in self.work and any(w > 0 for w in self.work.values())


def assign(
    reqs: list[Request],
    workers: Sequence[WorkerLink],
    hold: int,
    meter: Meter,
    now_ns: int,
    homes: Homes | None = None,
) -> list[Request]:
    """Give each request, in order, to the serving worker holding the least among those that
    hold its model (WorkerLink.models), while one has room under `hold` (a worker holding
    nothing takes any one text); the rest, in order. Once a model's text finds no room, none
    of that model's later texts is placed (none overtakes it); other models' still may be.
    With `homes`, a light model's texts go only to the first worker that holds it (Homes)."""
    if not workers:
        return reqs
    if len(workers) < 2:  # one worker: nothing is homed, so placements need not be counted
        homes = None
    light = homes.light(now_ns) if homes is not None else set()
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
            if homes is not None and m not in light and homes.unseen(m):
                light.add(m)
            if m in light and ks:
                ks[1:] = []  # its home
        if m in blocked or not ks:
            rest.append(r)
            continue
        k = min(ks, key=loads.__getitem__)
        limit = hold // 2 if r.group.priority else hold  # bulk: one batch of the two
        if m in light:
            limit *= HOME_HOLD_SHARE
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
        n = w.submit([(r.id, r.payload, r.deadline_ns, r.meta) for r in batch])
        if n and not f.held:
            f.mark_ns = now_ns  # it was idle: its busy time starts now
        for r in batch[:n]:
            r.worker = w
            r.group.started = True
            w.assigned[r.id] = r
            f.held += r.cost
            if homes is not None:
                homes.placed(r.group.model, r.cost)
        refused.extend(batch[n:])
    if refused:  # a ring was full: back in the order they were taken in
        order = {id(r): i for i, r in enumerate(reqs)}
        rest = sorted(refused + rest, key=lambda r: order[id(r)])
    return rest


def take_back(worker: WorkerLink) -> list[Request]:
    """Every request a dead or hung worker held, in order."""
    moved = sorted(worker.assigned.values(), key=lambda r: r.id)
    worker.assigned.clear()
    for r in moved:
        r.worker = None
    return moved
