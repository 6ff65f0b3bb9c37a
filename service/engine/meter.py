"""The pool's speed as admission estimates it: each worker's measured tokens/s while it had
work (Flow), the whole pool's under a backlog (Backlog), and the correction of the estimate by
what it promised (Meter.judge)."""

from __future__ import annotations

from collections.abc import Sequence

from ringserve.service.engine.requests import Holder

RATE_SAMPLE_NS = 200_000_000  # a worker's busy time per throughput sample
RATE_WEIGHT_NS = 1_000_000_000  # a sample of this much busy time moves the estimate halfway
# The estimate is corrected by what it promised: a text answered later than LATE_AT x
# --max-queue-ms after its admission tightens the bound by LATE_STEP, one in time relaxes it by
# ON_TIME_STEP, so under a steady overload about 1% are late (ln(1/0.97) = 0.0305 is 100 x
# 0.0003): the P99 holds. LATE_AT leaves a tenth to what the front-end does before admission and
# after the answer (parsing, refusing, writing): measured ~100 ms at 5x overload (README).
# The correction lasts as long as the backlog: once nothing is in flight it starts again at 1
# (a stalled worker's late answers would otherwise keep a quiet server tight for thousands of
# answers).
LATE_AT = 0.9
LATE_STEP = 0.97
ON_TIME_STEP = 1.0003
TIGHTEST = 0.5
BACKLOG_SAMPLE_NS = 500_000_000  # wall time of one sample of the pool's rate under a backlog
BACKLOG_FRESH_NS = 2_000_000_000  # a backlog sample this recent is the pool's rate


class Flow:
    """One worker as the dispatcher meters it: the cost it holds, and its measured tokens/s
    while it had work (an idle worker's time says nothing about its speed)."""

    __slots__ = ("busy_ns", "done", "held", "mark_ns", "rate")

    def __init__(self) -> None:
        self.held = 0  # cost of the requests in its ring or batcher
        self.mark_ns = 0  # when the current busy stretch was last accounted (0: idle)
        self.busy_ns = 0  # busy time not yet folded into `rate`
        self.done = 0  # cost answered in that time
        self.rate: float | None = None  # cost per second

    def answered(self, cost: int, now_ns: int) -> None:
        if self.mark_ns:
            self.busy_ns += now_ns - self.mark_ns
        self.done += cost
        self.held -= cost
        self.mark_ns = now_ns if self.held > 0 else 0
        if self.busy_ns >= RATE_SAMPLE_NS:
            sample = self.done * 1e9 / self.busy_ns
            weight = self.busy_ns / (self.busy_ns + RATE_WEIGHT_NS)
            self.rate = sample if self.rate is None else self.rate + (sample - self.rate) * weight
            self.busy_ns = self.done = 0

    def released(self, cost: int) -> None:
        """A text it held was given up (expired): it no longer counts as held."""
        self.held -= cost
        if self.held <= 0:
            self.mark_ns = 0


class Backlog:
    """The pool's answers per wall-clock second while requests waited in the front-end the
    whole time: its real speed under load, with whatever the front-end's own work (parsing,
    refusing, refilling the workers) costs it. Per-worker busy time alone misses the moments a
    worker idles because the front-end has not refilled it yet."""

    __slots__ = ("at_ns", "done", "rate", "start_ns")

    def __init__(self) -> None:
        self.start_ns = 0  # the current window (0: no backlog)
        self.done = 0
        self.rate: float | None = None
        self.at_ns = 0  # when `rate` was last sampled

    def answered(self, cost: int, now_ns: int, backlogged: bool) -> None:
        if not backlogged:
            self.start_ns = 0
            return
        if not self.start_ns:
            self.start_ns, self.done = now_ns, 0
            return
        self.done += cost
        span = now_ns - self.start_ns
        if span >= BACKLOG_SAMPLE_NS:
            sample = self.done * 1e9 / span
            self.rate = sample if self.rate is None else (self.rate + sample) / 2
            self.at_ns = now_ns
            self.start_ns, self.done = now_ns, 0

    def fresh(self, now_ns: int) -> float | None:
        return (
            self.rate if self.rate is not None and now_ns - self.at_ns < BACKLOG_FRESH_NS else None
        )


class Meter:
    """Every worker's Flow, the pool's Backlog, and `tighten`: the share of the time bound
    admission uses (see LATE_STEP)."""

    def __init__(self) -> None:
        self.flows: dict[Holder, Flow] = {}
        self.backlog = Backlog()
        self.tighten = 1.0

    def flow(self, worker: Holder) -> Flow:
        f = self.flows.get(worker)
        if f is None:
            f = self.flows[worker] = Flow()
        return f

    def rate(self, serving: Sequence[Holder], now_ns: int) -> float | None:
        """The pool's cost per second: as measured under a backlog when one is recent, else
        the serving workers' measured rates together (a worker not yet measured counts as the
        mean of those that are). None before any is measured."""
        under_load = self.backlog.fresh(now_ns)
        if under_load is not None:
            return under_load
        rates = [f.rate for w in serving if (f := self.flows.get(w)) and f.rate is not None]
        if not rates:
            return None
        return sum(rates) / len(rates) * len(serving)

    def cost_limit(
        self, serving: Sequence[Holder], now_ns: int, max_queue_ms: float
    ) -> float | None:
        """The queued cost that a time bound of `max_queue_ms` allows now (tightened), or None
        (no bound by time, or no rate measured yet)."""
        if max_queue_ms <= 0:
            return None
        rate = self.rate(serving, now_ns)
        return None if rate is None else rate * max_queue_ms / 1000 * self.tighten

    def answered(self, worker: Holder, cost: int, now_ns: int, backlogged: bool) -> None:
        self.flow(worker).answered(cost, now_ns)
        self.backlog.answered(cost, now_ns, backlogged)

    def released(self, worker: Holder, cost: int) -> None:
        f = self.flows.get(worker)
        if f is not None:
            f.released(cost)

    def judge(self, latency_ns: int, max_queue_ms: float, rerouted: bool, dry: bool) -> None:
        """Correct the time bound by one answer's latency (a rerouted text's wait says nothing
        of admission); `dry`: nothing is in flight any more, the correction is over."""
        if max_queue_ms > 0 and not rerouted:
            if latency_ns > max_queue_ms * 1e6 * LATE_AT:
                self.tighten = max(TIGHTEST, self.tighten * LATE_STEP)
            elif self.tighten < 1.0:
                self.tighten = min(1.0, self.tighten * ON_TIME_STEP)
        if dry:
            self.tighten = 1.0

    def forget(self, worker: Holder) -> None:
        self.flows.pop(worker, None)
