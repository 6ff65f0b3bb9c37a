"""How many texts the queue takes now, as one pure decision: the hard ceiling by count
(--max-queue) and the standing queue by measured delay (--max-queue-ms); and how long an
admitted text may wait for a worker (queue_by).

The delay is measured, not estimated: it is how long the oldest text still waiting in the
front-end for this model and priority has waited (CoDel's sojourn time, Nichols and Jacobson
2012). A queue refuses new work only once that delay has stood above the target for a whole
INTERVAL_MS. The waiting lines are first in, first out, so the oldest waiting text being older
than target + interval means that at every moment of the last interval the text then at the
front had waited longer than the target: the queue stood, it did not just pass through. And a
queue that was empty at any moment of the interval holds nothing older than the interval, so
it admits. That is the test of "Fail at Scale" (Facebook, 2015) without a sampler: a burst
that meets an empty queue is admitted whole (up to --max-queue) and served at full batches,
and only a queue that keeps standing is refused.

The head's age says how long the queue has stood, not how long a text admitted now will wait:
while the head is young, a 5x overload keeps being admitted, and the tail of what was admitted
then would wait several times the target. So, again as "Fail at Scale" does, a text admitted
into a queue that was not fresh (its oldest waiting text had waited an interval already) may
wait for a worker only until `queue_by`: past it, it is refused (503) without running, within
--max-queue-ms of its arrival, together with its request's other texts (a request a worker has
started is run whole). A burst into a fresh queue waits as long as its deadline allows.

Waiting to refuse is slow, though: under 5x overload most texts would be refused only after
waiting the whole bound. So a queue that is not fresh also looks ahead, with the one figure an
estimate needs: how fast the work admitted so far is being answered, measured in this stretch
(Drain), at the batch sizes the standing queue is served at. When that work takes longer than
the bound, a new text would be refused after waiting it out: it is refused at once instead.
A fresh queue never looks ahead, so bursts are judged by the measured delay alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# CoDel's interval: how long the delay must stand above the target before new work is refused,
# and how young the queue's oldest text must be for a new one to count as part of a burst that
# met a fresh queue. CoDel and Facebook's queues use 100 ms for targets of 5 ms; ours is 1 s, and
# 200 ms lets a burst's clients (8 concurrent HTTP batches, 50 pipelining connections, measured
# arriving within 5-30 ms here) arrive together on a loaded machine.
INTERVAL_MS = 200.0
# The expiry timer's tick (service.engine.expiry): a text past its queue_by is refused at the
# next tick, so queue_by leaves two ticks' room within --max-queue-ms (the timer can run late).
TICK_MS = 50.0
# The drain (how fast a model's admitted work is answered) is measured over at most the last
# DRAIN_WINDOW_NS of the queue's current stretch, and only once that stretch is DRAIN_MIN_NS
# long: a few batches' answers (a long-text batch takes 100-300 ms here).
DRAIN_WINDOW_NS = 1_000_000_000
DRAIN_MIN_NS = int(2 * INTERVAL_MS * 1e6)


@dataclass(frozen=True, slots=True)
class Free:
    """The queue as a new text finds it."""

    slots: int  # texts it may still take by count
    empty: bool  # nothing of this model in flight
    fits: int  # empty: the most one request may bring at once
    delay_ms: float  # how long the oldest text waiting before it has waited (0: none waits)
    target_ms: float  # --max-queue-ms (0: no bound by time)
    # A queue that is not fresh: how long the work admitted before it takes to answer at the
    # drain measured in this stretch (None: fresh, or not measured yet; see Drain)
    ahead_ms: float | None = None

    @property
    def standing(self) -> bool:
        """The delay has stood above the target for a whole interval."""
        return self.target_ms > 0 and self.delay_ms > self.target_ms + INTERVAL_MS

    @property
    def too_late(self) -> bool:
        """A queue that stood an interval already holds more work than its measured drain
        answers within the bound a text admitted now would get (queue_by): the text would be
        refused after waiting, so it is refused now."""
        return self.ahead_ms is not None and self.ahead_ms > bound_ms(self.target_ms)


FULL = "queue is full"  # the refusal by count (--max-queue), which a client's share may undo


def room(n: int, whole: bool, free: Free) -> tuple[int, str | None]:
    """How many of n texts, taken in order, may be admitted, and why not all (or None).

    A standing queue takes none. Otherwise independent texts (`whole` False: binary frames)
    are admitted while the queue has a slot, and a request of several texts (`whole`) entire
    or not at all: into an empty queue up to `fits` (its model's limit), else while the slots
    last. Fair shares between clients apply only through the ceiling and the standing test,
    so a burst on an idle server is never cut."""
    if free.standing:
        return 0, (
            f"queue is standing: its oldest text has waited {free.delay_ms:.0f} ms, over "
            f"--max-queue-ms {free.target_ms:g} for {INTERVAL_MS:g} ms"
        )
    if free.too_late:
        return 0, (
            f"queue is standing: the work admitted before this text takes about "
            f"{free.ahead_ms:.0f} ms at the rate it is answered, over --max-queue-ms "
            f"{free.target_ms:g}"
        )
    if whole and n > 1:
        limit = free.fits if free.empty else free.slots
        return (n, None) if n <= limit else (0, FULL)
    k = min(n, max(0, free.slots))
    return k, (FULL if k < n else None)


def queue_by(admitted_ns: int, delay_ms: float, target_ms: float) -> int:
    """Until when a text admitted now may wait for a worker (0: no bound but its deadline).
    Bounded only when the queue was not fresh: its oldest waiting text (`delay_ms`) had waited
    an interval already; then it is refused within --max-queue-ms of its arrival."""
    if target_ms <= 0 or delay_ms < INTERVAL_MS:
        return 0
    return admitted_ns + int(bound_ms(target_ms) * 1e6)


def bound_ms(target_ms: float) -> float:
    """How long a text admitted into a queue that was not fresh may wait for a worker."""
    return max(target_ms - 2 * TICK_MS, TICK_MS)


class Drain:
    """How fast one model's admitted work is answered: its answered cost, sampled at most
    every tick. Measured, in the stretch the queue now stands, at the batch sizes it is served
    at: the rate a standing queue drains at, never a rate taken at another load."""

    __slots__ = ("samples", "total")

    def __init__(self) -> None:
        self.total = 0  # cost answered, ever
        self.samples: deque[tuple[int, int]] = deque()  # (when, total then)

    def answered(self, cost: int, now_ns: int) -> None:
        self.total += cost
        samples = self.samples
        if samples and samples[-1][0] == now_ns:  # one read of a ring: one instant
            samples[-1] = (now_ns, self.total)
        elif not samples or now_ns - samples[-1][0] >= TICK_MS * 1e6:
            samples.append((now_ns, self.total))
        while samples and now_ns - samples[0][0] > 2 * DRAIN_WINDOW_NS:
            samples.popleft()

    def per_s(self, now_ns: int, since_ns: int) -> float | None:
        """Cost answered a second since `since_ns` (the queue's stretch), over at most the last
        window; None when that is shorter than DRAIN_MIN_NS or nothing was answered in it
        (a stalled pool is the standing test's and the supervisor's to judge)."""
        start = max(since_ns, now_ns - DRAIN_WINDOW_NS)
        for when, total in self.samples:
            if when >= start:
                span = now_ns - when
                if span < DRAIN_MIN_NS or self.total == total:
                    return None
                return (self.total - total) * 1e9 / span
        return None
