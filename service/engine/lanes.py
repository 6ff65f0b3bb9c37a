"""One lane per model in the front-end: its queue limit, what it has admitted and not answered,
and who waits for that to reach zero; and every lane's waiting texts as one queue (`Lines`),
taken round-robin across models, so a flood of one model cannot starve another's texts.

Within a model the order is the one-model order (requests.Waiting: interactive texts first, a
bulk text once it has waited its bound; no newer text before an older one of its kind). Across
models, each turn takes the oldest text of the next model in turn, preferring a model whose next
text is interactive (or a bulk text past its bound) over one with only bulk texts waiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

from ringserve.service.engine.bounds import Drain
from ringserve.service.engine.link import WorkerLink
from ringserve.service.engine.meter import Meter
from ringserve.service.engine.requests import BULK, INTERACTIVE, Request, Waiting
from ringserve.service.engine.routing import Homes, assign
from ringserve.shm import layout as L

# Priority (service.engine.tenants): bulk texts may fill the queue only up to this share of
# --max-queue, so interactive texts always find room; and a worker takes bulk work only while it
# holds less than one batch (routing.assign), so an interactive text waits behind one bulk batch
# at most. A bulk text waits behind interactive texts at most `bulk_wait_ns` (Waiting).
BULK_QUEUE_SHARE = 0.75
# Many models: half of --max-queue is kept, in equal shares, for the open models that hold less
# than their share, so that a flood of one model refuses only that model's texts (Lanes.
# reserved); a model alone may fill all of it.
MODEL_RESERVE_SHARE = 0.5


class Lane:
    """One model as the dispatcher admits it."""

    __slots__ = (
        "bulk_texts",
        "cost",
        "depth",
        "drain",
        "index",
        "max_queue",
        "name",
        "open",
        "priority",
        "rejected",
        "shape",
        "waiters",
        "warm",
    )

    def __init__(self, index: int, name: str, max_queue: int) -> None:
        self.index = index  # the wire index (shm.layout.request_meta), never reused
        self.name = name
        self.max_queue = max_queue  # its own --max-queue, within the total (0: the total)
        self.open = True  # closed: new texts are refused as for an unknown model
        self.depth = 0  # admitted, not yet answered
        self.cost = 0  # of those (requests.text_cost)
        self.rejected = 0  # texts refused for lack of room (503)
        # The level its texts are batched at, at most (a config file table's `priority`): a key
        # or a request may lower it, never raise it (Admission.level); and its bulk texts.
        self.priority = INTERACTIVE
        self.bulk_texts = 0
        self.drain = Drain()  # how fast its answered cost comes back (bounds.Drain)
        self.waiters: list[asyncio.Future[None]] = []  # when_empty
        # (labels, dimension) of the model: what its workers' answers must hold (answers.py
        # checks each one against it); None: not said, only an answer's own form is checked.
        self.shape: tuple[int, int] | None = None
        # The options byte of the text a new worker answers before it serves this model
        # (service/pool/warmup.py): the kind of answer the model gives (ModelInfo.warm_options).
        self.warm = 0

    def admitted(self, n: int, cost: int) -> None:
        self.depth += n
        self.cost += cost

    def ahead_ms(self, now: int, delay_ns: int, skipped: int) -> float | None:
        """How long the work admitted so far (less `skipped` cost a new text goes before) takes
        at the rate it is answered since the oldest waiting text came (bounds.Drain); None
        while that rate is not measured."""
        rate = self.drain.per_s(now, now - delay_ns)
        if rate is None:
            return None
        return max(self.cost - skipped, 0) * 1e3 / rate

    def answered(self, cost: int) -> None:
        """One of its texts was answered: wake who waits for none to be left."""
        self.depth -= 1
        self.cost -= cost
        if not self.depth and self.waiters:
            waiters, self.waiters = self.waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)


class Lanes:
    """Every model's lane, open or not, and every name ever opened (for refusals): the
    dispatcher's per-model bookkeeping. Model 0 is open from the start with the total as its
    limit, so a one-model server behaves as it always has."""

    __slots__ = ("lanes", "names")

    def __init__(self) -> None:
        self.lanes: dict[int, Lane] = {0: Lane(0, "", 0)}  # one a model, open or not
        self.names: dict[int, str] = {0: ""}  # every model ever opened

    def open(
        self,
        index: int,
        name: str,
        max_queue: int,
        priority: int = INTERACTIVE,
        shape: tuple[int, int] | None = None,
        warm: int = 0,
    ) -> None:
        """Admit texts for the model from now on, up to `max_queue` of them at once (within
        the total; 0: the total alone), at `priority` at most; open again, it keeps what it
        had admitted. `shape`: its (labels, dimension), which its answers must have."""
        if not 0 <= index < L.MAX_MODELS:
            raise ValueError(f"model index {index} is outside 0..{L.MAX_MODELS - 1}")
        lane = self.lanes.get(index)
        if lane is None:
            lane = self.lanes[index] = Lane(index, name, max_queue)
        lane.name, lane.max_queue, lane.open = name, max_queue, True
        lane.priority = priority
        if shape is not None:
            lane.shape = shape
        lane.warm = warm
        self.names[index] = name

    def close(self, index: int) -> None:
        """Refuse the model's new texts as unknown from now on; what it admitted is still
        answered (when_empty says when)."""
        lane = self.lanes.get(index)
        if lane is not None:
            lane.open = False

    def is_open(self, index: int) -> bool:
        lane = self.lanes.get(index)
        return lane is not None and lane.open

    def name(self, index: int) -> str:
        """The model's name as it was opened (its index, for one never opened)."""
        return self.names.get(index) or str(index)

    def priority(self, index: int) -> int:
        """The level the model's texts are batched at, at most (INTERACTIVE for one unknown)."""
        lane = self.lanes.get(index)
        return lane.priority if lane is not None else INTERACTIVE

    def depth(self, index: int) -> int:
        """Texts admitted for the model and not yet answered."""
        lane = self.lanes.get(index)
        return lane.depth if lane is not None else 0

    def when_empty(self, index: int) -> asyncio.Future[None]:
        """Resolves once nothing admitted for the model is unanswered (at once if nothing is)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane = self.lanes.get(index)
        if lane is None or not lane.depth:
            fut.set_result(None)
        else:
            lane.waiters.append(fut)
        return fut

    def free(self, model: int, priority: int, inflight: int, total: int) -> tuple[int, bool, int]:
        """(free, empty, fits) for the open model's texts: the slots they may take now, within
        the total (`total`, `inflight` of it taken, less what the other models are owed) and
        the model's own limit, bulk texts only BULK_QUEUE_SHARE of each; whether it holds
        none; and, empty, the most it takes at once (any batch within its limit and the
        total's free room)."""
        lane = self.lanes[model]
        mine = lane.max_queue or total
        free_total = total - inflight - self.reserved(model, total)
        free_mine = mine - lane.depth
        if priority == BULK:
            free_total -= total - int(total * BULK_QUEUE_SHARE)
            free_mine -= mine - int(mine * BULK_QUEUE_SHARE)
        return min(free_total, free_mine), not lane.depth, min(mine, free_total)

    def reserved(self, model: int, max_queue: int) -> int:
        """The slots of the total (`max_queue`) that the other open models are still owed:
        each is owed its share of MODEL_RESERVE_SHARE of it (or its own limit, if less) until
        it holds that many, so one model's flood leaves room for every other."""
        lanes = self.lanes
        if len(lanes) < 2:
            return 0
        others = [lane for lane in lanes.values() if lane.open and lane.index != model]
        if not others:
            return 0
        share = int(max_queue * MODEL_RESERVE_SHARE) // (len(others) + 1)
        return sum(max(0, min(share, lane.max_queue or share) - lane.depth) for lane in others)


class Count:
    """How many of one kind of text wait, over every lane (a Sized view, for metrics)."""

    __slots__ = ("kind", "lines")

    def __init__(self, lines: Lines, kind: str) -> None:
        self.lines = lines
        self.kind = kind  # "interactive" or "bulk"

    def __len__(self) -> int:
        return sum(len(getattr(w, self.kind)) for w in self.lines.lines.values())

    def __bool__(self) -> bool:
        return any(getattr(w, self.kind) for w in self.lines.lines.values())


class Lines:
    """Admitted texts in no ring yet, one Waiting a model, taken round-robin across models.

    `turns` holds the models with texts waiting, the next turn first; a model whose texts were
    taken but not placed (push_front) gets its turn back first, so room that frees up goes to
    the model that was refused it."""

    __slots__ = ("bulk", "homes", "interactive", "lines", "max_wait_ns", "turns")

    def __init__(self, max_wait_ns: int) -> None:
        self.max_wait_ns = max_wait_ns
        self.lines: dict[int, Waiting] = {}
        self.turns: deque[int] = deque()
        self.homes = Homes()  # which models are light, so placed on one home worker
        self.bulk = Count(self, "bulk")
        self.interactive = Count(self, "interactive")

    def line(self, model: int) -> Waiting:
        w = self.lines.get(model)
        if w is None:
            w = self.lines[model] = Waiting(self.max_wait_ns)
        return w

    def __len__(self) -> int:
        return sum(len(w) for w in self.lines.values())

    def __bool__(self) -> bool:
        return bool(self.turns)

    def __iter__(self) -> Iterator[Request]:
        for m in self.turns:
            yield from self.lines[m]

    def waiting_for(self, model: int) -> int:
        """How many of the model's texts wait."""
        w = self.lines.get(model)
        return len(w) if w is not None else 0

    def oldest_ns(self, model: int, priority: int) -> int | None:
        """When the oldest text that a new text of this model and priority waits behind was
        admitted (requests.Waiting.oldest_ns); None when none waits. Each model has its own
        line, taken in turn, so a flood of one model does not make another's queue stand."""
        w = self.lines.get(model)
        return w.oldest_ns(priority) if w is not None else None

    def bulk_cost(self, model: int) -> int:
        """The cost of the model's bulk texts waiting (an interactive text goes before them)."""
        w = self.lines.get(model)
        return w.bulk_cost if w is not None else 0

    def oldest_of_all(self) -> int | None:
        """When the oldest text waiting for any model was admitted (for /v1/stats)."""
        heads = [w.oldest_ns(BULK) for w in self.lines.values()]
        return min((h for h in heads if h is not None), default=None)

    def extend(self, reqs: Iterable[Request]) -> None:
        for r in reqs:
            w = self.line(r.group.model)
            if not w:
                self.turns.append(r.group.model)
            w.extend((r,))

    def push_front(self, reqs: list[Request]) -> None:
        """Put requests back at the front of their lines, in their order; their models take
        the next turns, in the order of their first request here."""
        by_model: dict[int, list[Request]] = {}
        for r in reqs:
            by_model.setdefault(r.group.model, []).append(r)
        for m, rs in by_model.items():
            if self.lines.get(m):
                self.turns.remove(m)
            self.line(m).push_front(rs)
        self.turns.extendleft(reversed(by_model))

    def take(self, n: int, now_ns: int) -> list[Request]:
        """Up to n requests in the order they should go to workers: one a model in turn."""
        out: list[Request] = []
        turns = self.turns
        while len(out) < n and turns:
            k = self.next_turn(now_ns)
            m = turns[k]
            del turns[k]
            w = self.lines[m]
            out.append(w.pop(now_ns))
            if w:
                turns.append(m)
        return out

    def next_turn(self, now_ns: int) -> int:
        """The first model in turn whose next text is interactive or a bulk text past its
        bound; with only bulk texts waiting, the first in turn."""
        for k, m in enumerate(self.turns):
            if self.lines[m].urgent(now_ns):
                return k
        return 0

    def remove(self, r: Request) -> None:
        """Raises ValueError when it is not waiting."""
        m = r.group.model
        w = self.lines.get(m)
        if w is None:
            raise ValueError("not waiting")
        w.remove(r)
        if not w:
            self.turns.remove(m)

    def place(
        self,
        reqs: list[Request],
        serving: Sequence[WorkerLink],
        hold: int,
        meter: Meter,
        now_ns: int,
    ) -> None:
        """Send requests to the least-loaded serving workers (routing.assign, each holding up
        to `hold`); keep the rest waiting, in order."""
        if self:  # older requests go first
            self.extend(reqs)
            self.flush(serving, hold, meter, now_ns)
            return
        self.extend(assign(reqs, serving, hold, meter, now_ns, self.homes))

    def flush(self, serving: Sequence[WorkerLink], hold: int, meter: Meter, now_ns: int) -> None:
        """Hand the oldest waiting requests to workers with room, as many as they take."""
        if not self or not serving:
            return
        while self:
            taken = self.take(256, now_ns)
            rest = assign(taken, serving, hold, meter, now_ns, self.homes)
            if rest:
                self.push_front(rest)
                # Another model's texts may still fit where this one's did not: go on while
                # some were placed and more than one model was left.
                if len(rest) == len(taken) or len({r.group.model for r in rest}) == 1:
                    return

    def clear(self) -> None:
        for w in self.lines.values():
            w.clear()
        self.turns.clear()
