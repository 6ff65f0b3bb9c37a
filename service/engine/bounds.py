"""How many texts the queue takes now: the admission bound by count (--max-queue) and by time
(--max-queue-ms, as a cost the pool answers in that time), as one pure decision."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Free:
    """The queue as a new text finds it."""

    slots: int  # texts it may still take by count
    ahead: int  # the cost queued before it
    limit: float | None  # the cost --max-queue-ms allows (None: no bound by time)
    empty: bool  # nothing in flight
    max_queue: int
    max_queue_ms: float


def room(costs: list[int], whole: bool, free: Free) -> tuple[int, str | None]:
    """How many of these texts, taken in order, may be admitted, and why not all (or None).

    Independent texts (`whole` False: binary frames) are admitted while the queue has a
    slot and its estimated wait is within --max-queue-ms. A request of several texts
    (`whole`) is admitted entire or not at all, and may take at most half of what is free,
    by count and by time, so that one client's big batches cannot fill the queue for the
    rest; into an empty queue it always fits, as long as it fits --max-queue."""
    n = len(costs)
    limit = free.limit
    if whole and n > 1:
        if free.empty:
            return (n if n <= free.max_queue else 0), None
        fits = n <= free.slots // 2
        if fits and limit is not None:
            fits = sum(costs) <= (limit - free.ahead) / 2
        if not fits:
            return 0, "queue is full: a batch may take at most half of what is free"
        return n, None
    k = min(n, max(0, free.slots))
    why = "queue is full" if k < n else None
    if limit is not None:
        queued, timed = free.ahead, 0
        while timed < k and queued <= limit:
            queued += costs[timed]
            timed += 1
        if timed < k:
            why = f"queue is full: estimated wait over {free.max_queue_ms:g} ms"
        k = timed
    return k, why
