"""A connection's allowance for input that does no useful work, as a token bucket: `burst` units
at once, refilled at `rate` a second. Each protocol decides what costs (HTTP/2's empty and
unknown frames and resets, a binary connection's bad frames, HTTP/1.1's tiny chunks); a
connection that spends more than the bucket holds is closed, as nghttp2 and Go's http2 close
theirs (docs/design.md, "Budgets"). A client that wastes now and then never runs dry."""

from __future__ import annotations

from collections.abc import Callable


class Budget:
    __slots__ = ("burst", "clock", "rate", "stamp", "tokens")

    def __init__(self, burst: float, rate: float, clock: Callable[[], int]) -> None:
        self.burst, self.rate, self.clock = burst, rate, clock  # clock: monotonic ns
        self.tokens = burst
        self.stamp = clock()

    def spend(self, cost: float = 1.0) -> bool:
        """Take `cost`; False once the bucket is overdrawn (the connection should end)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate / 1e9)
        self.stamp = now
        self.tokens -= cost
        return self.tokens >= 0
