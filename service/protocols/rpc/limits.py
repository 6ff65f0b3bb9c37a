"""The gRPC port's bounds on its connections, as the HTTP and binary ports have theirs: at most
--max-connections open at once (one more gets GOAWAY and is closed), and the sweep's clocks
(every quarter second): a connection whose preface and SETTINGS do not come within
--read-timeout-s is closed; one with no call open for --grpc-idle-timeout-s gets GOAWAY, as at
the drain (grpc's clients reconnect for their next call); one that leaves our answers unread
(its writes paused) past --write-timeout-s is dropped; and a call whose request message or
half-close stops coming for --read-timeout-s ends DEADLINE_EXCEEDED, so what it held is given
back (docs/design.md, "gRPC", "Bounds")."""

from __future__ import annotations

from ringserve.service.config.settings import Config
from ringserve.service.protocols.rpc import http2 as h2
from ringserve.service.protocols.rpc.http2 import Connection


class Seen:
    """What the sweep last saw of one connection."""

    __slots__ = ("active_ns", "last_id", "opened_ns", "paused_ns", "stalls")

    def __init__(self, now_ns: int) -> None:
        self.opened_ns = self.active_ns = now_ns
        self.last_id = 0  # the stream id last seen: a new call is activity
        self.paused_ns = 0  # since when our writes are paused (0: they are not)
        self.stalls: dict[int, tuple[int, int, int, int]] = {}  # stream: (marks..., since_ns)


class ConnectionLimits:
    """The port's open connections, each with what the sweep saw of it."""

    def __init__(self, settings: Config) -> None:
        self.max_connections = settings.max_connections
        self.read_ns = int(settings.read_timeout_s * 1e9)
        self.idle_ns = int(settings.grpc_idle_timeout_s * 1e9)
        self.write_ns = int(settings.write_timeout_s * 1e9)
        self.connections: dict[Connection, Seen] = {}
        self.refused = 0  # connections over the cap

    def admit(self, conn: Connection, now_ns: int) -> bool:
        """Take a new connection, or refuse it (GOAWAY, then closed) over the cap."""
        if len(self.connections) >= self.max_connections:
            self.refused += 1
            conn.end.fail(h2.NO_ERROR, "too many connections")
            return False
        self.connections[conn] = Seen(now_ns)
        return True

    def forget(self, conn: Connection) -> None:
        self.connections.pop(conn, None)

    def sweep(self, now_ns: int) -> None:
        for conn, seen in list(self.connections.items()):
            if not conn.lost:
                self.check(conn, seen, now_ns)

    def check(self, conn: Connection, seen: Seen, now_ns: int) -> None:
        if conn.paused_writing:
            seen.paused_ns = seen.paused_ns or now_ns
            if now_ns - seen.paused_ns > self.write_ns:
                conn.end.drop()
            return
        seen.paused_ns = 0
        if not conn.settled:
            if now_ns - seen.opened_ns > self.read_ns:
                conn.end.fail(h2.NO_ERROR, "no preface and SETTINGS within the read timeout")
            return
        table = conn.table
        if table.streams or table.last_id != seen.last_id or table.pending is not None:
            seen.active_ns, seen.last_id = now_ns, table.last_id
        elif now_ns - seen.active_ns > self.idle_ns and conn.end.goaway_at is None:
            conn.end.final_goaway()  # no stream open: it closes at once
            return
        if conn.inflow.held and conn.reading:
            self.stalled(conn, seen, now_ns)
        elif seen.stalls:
            seen.stalls.clear()

    def stalled(self, conn: Connection, seen: Seen, now_ns: int) -> None:
        """End the calls whose request bytes have not moved for the read timeout. One waiting
        for its window to be granted (Inflow.want) waits for the others: it is stalled only
        while the connection's bytes held do not move either."""
        stalls: dict[int, tuple[int, int, int, int]] = {}
        held = conn.inflow.held
        for sid, stream in list(conn.table.streams.items()):
            if not stream.held or stream.done:
                continue
            marks = (stream.held, stream.window, held if stream.wanted else 0)
            was = seen.stalls.get(sid)
            if was is None or was[:3] != marks:
                stalls[sid] = (*marks, now_ns)
            elif now_ns - was[3] > self.read_ns:
                stream.finish(h2.DEADLINE_EXCEEDED, "request not received within the read timeout")
            else:
                stalls[sid] = was
        seen.stalls = stalls
