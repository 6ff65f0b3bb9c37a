"""Each worker's speed as the dispatcher meters it: the cost it holds (what routing fills up
to `hold_cost`) and its measured tokens/s while it had work (for /v1/stats and /metrics).
Admission does not use these rates: it refuses by the queue's measured delay
(service.engine.bounds), since a rate measured at one batch size says little of another."""

from __future__ import annotations

from collections.abc import Sequence

from ringserve.service.engine.requests import Holder

RATE_SAMPLE_NS = 200_000_000  # a worker's busy time per throughput sample
RATE_WEIGHT_NS = 1_000_000_000  # a sample of this much busy time moves the estimate halfway


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


class Meter:
    """Every worker's Flow."""

    def __init__(self) -> None:
        self.flows: dict[Holder, Flow] = {}

    def flow(self, worker: Holder) -> Flow:
        f = self.flows.get(worker)
        if f is None:
            f = self.flows[worker] = Flow()
        return f

    def rate(self, serving: Sequence[Holder]) -> float | None:
        """The pool's cost per second: the serving workers' measured rates together (a worker
        not yet measured counts as the mean of those that are). None before any is measured."""
        rates = [f.rate for w in serving if (f := self.flows.get(w)) and f.rate is not None]
        if not rates:
            return None
        return sum(rates) / len(rates) * len(serving)

    def answered(self, worker: Holder, cost: int, now_ns: int) -> None:
        self.flow(worker).answered(cost, now_ns)

    def released(self, worker: Holder, cost: int) -> None:
        f = self.flows.get(worker)
        if f is not None:
            f.released(cost)

    def forget(self, worker: Holder) -> None:
        self.flows.pop(worker, None)
