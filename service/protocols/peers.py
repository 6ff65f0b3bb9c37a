"""What the HTTP and binary ports know of the client at the other end of a connection: its
address (`peer_of`), whether it is still there (`peer_gone`), its share of the port's
connection cap (`Seats`), and its failed key attempts (`KeyFailures`).

A client is an address: an IPv4 address, or the /64 an IPv6 address is in (one host is given a
whole /64, and could otherwise take a fresh address for every attempt).
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

TCP_CLOSE = 7  # tcp_info.tcpi_state of a connection the peer reset (linux/tcp_states.h)
# After a write to a client that sent EOF: when its socket is asked whether it answered with a
# reset (a closed socket does, at once on a LAN; the sweeps ask again every 0.25 s after).
PEER_CHECKS_S = (0.002, 0.02, 0.2)
# Failed key attempts are kept for this many addresses at most; past it, those that have
# refilled go first, then the oldest (an address forgotten starts again with its whole burst).
MAX_ADDRESSES = 4096


def peer_of(transport: Any) -> str:
    """The client address of a connection ("" when it has none: a Unix socket, a test's fake
    transport)."""
    get = getattr(transport, "get_extra_info", None)
    peer = get("peername") if get is not None else None
    if not isinstance(peer, tuple) or not peer:
        return ""
    host = str(peer[0])
    if ":" in host:  # IPv6: its /64, or the IPv4 address it maps
        try:
            addr = ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return host
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return host


def peer_gone(transport: Any) -> bool:
    """The peer reset the connection (TCP says CLOSE): it closed its socket and answered data
    we wrote after its EOF with a reset. A peer that only shut its sending side (a half-close)
    is still in CLOSE_WAIT and reads on. False where TCP_INFO is not to be had."""
    get = getattr(transport, "get_extra_info", None)
    sock = get("socket") if get is not None else None
    if sock is None:
        return False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except (OSError, AttributeError, ValueError):
        return False
    return bool(info) and info[0] == TCP_CLOSE


def check_soon(check: Callable[[], object]) -> None:
    """Call `check` at each of PEER_CHECKS_S from now (nothing outside a running loop: the
    in-process tests call it themselves)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    for delay in PEER_CHECKS_S:
        loop.call_later(delay, check)


class Seat(Protocol):
    """A connection as the cap sees it."""

    peer: str

    def idle_since(self) -> float | None: ...  # when it last did anything; None: it is busy
    def evict(self) -> None: ...  # close it now (it is idle)


class Seats:
    """One port's connections by client address. Under the cap, any connection is taken. At
    the cap, a client holding fewer connections than the busiest one gets in by closing the
    busiest one's longest-idle connection (a client that holds many idle connections gives
    way to one that holds few); when that one has none idle, the new connection is refused."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.by_peer: dict[str, set[Seat]] = {}
        self.count = 0
        self.evicted = 0

    def take(self, conn: Seat) -> bool:
        """Seat `conn` (True), or say it must be refused (False)."""
        if self.count >= self.cap and not self.make_room(conn.peer):
            return False
        self.by_peer.setdefault(conn.peer, set()).add(conn)
        self.count += 1
        return True

    def leave(self, conn: Seat) -> None:
        mine = self.by_peer.get(conn.peer)
        if mine is not None and conn in mine:
            mine.discard(conn)
            self.count -= 1
            if not mine:
                del self.by_peer[conn.peer]

    def make_room(self, peer: str) -> bool:
        have = len(self.by_peer.get(peer, ()))
        busiest = max(self.by_peer, key=lambda p: len(self.by_peer[p]), default=None)
        if busiest is None or busiest == peer or len(self.by_peer[busiest]) <= have + 1:
            return False
        idle = [(since, c) for c in self.by_peer[busiest] if (since := c.idle_since()) is not None]
        if not idle:
            return False
        victim = min(idle, key=lambda sc: sc[0])[1]
        self.leave(victim)
        victim.evict()
        self.evicted += 1
        return True


class KeyFailures:
    """Failed key attempts per client address, as a token bucket: `burst` at once, refilled
    evenly over `window_s`. An address past them is refused without its key being checked
    (`wait_s` says how long until its next attempt), so guessing goes no faster than the
    bucket refills, whatever the client sends."""

    def __init__(
        self, burst: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.rate = burst / window_s if window_s > 0 else math.inf  # attempts a second
        self.clock = clock
        self.buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when)
        self.throttled = 0  # requests refused unchecked

    def tokens(self, peer: str, now: float) -> float:
        tokens, when = self.buckets.get(peer, (self.burst, now))
        return min(self.burst, tokens + (now - when) * self.rate)

    def wait_s(self, peer: str) -> int:
        """0 when the address may try a key now; else whole seconds until it may (counted as
        throttled)."""
        if not self.burst or peer not in self.buckets:
            return 0
        now = self.clock()
        tokens = self.tokens(peer, now)
        if tokens >= 1:
            return 0
        self.throttled += 1
        return max(1, math.ceil((1 - tokens) / self.rate))

    def failed(self, peer: str) -> None:
        if not self.burst:
            return
        now = self.clock()
        tokens = self.tokens(peer, now) - 1
        self.buckets.pop(peer, None)
        self.buckets[peer] = (tokens, now)  # the newest last: the oldest go first when full
        if len(self.buckets) > MAX_ADDRESSES:
            self.forget(now)

    def forget(self, now: float) -> None:
        """Drop the addresses whose bucket has refilled; then, if still too many, the oldest,
        down to 7/8 of MAX_ADDRESSES (so the scan runs once in many failures, not each)."""
        for peer in [p for p in self.buckets if self.tokens(p, now) >= self.burst]:
            del self.buckets[peer]
        while len(self.buckets) > MAX_ADDRESSES * 7 // 8:
            del self.buckets[next(iter(self.buckets))]
