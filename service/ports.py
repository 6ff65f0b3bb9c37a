"""The listeners of one server and the protocol states behind them: which sockets it serves on
(bound, and inherited from the server beside it under --reuse-port), the control socket's path,
and the HTTP, operator, binary and gRPC states the drain and the sweep walk through."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import TYPE_CHECKING

from ringserve.service.config.settings import Config
from ringserve.service.logs import EventLog
from ringserve.service.protocols.binary import BinaryServerState
from ringserve.service.protocols.handover import listening_fds
from ringserve.service.protocols.http import HttpServerState
from ringserve.service.protocols.tls import Tls

if TYPE_CHECKING:
    from ringserve.service.protocols.rpc.server import GrpcPort


class Ports:
    """Implements handover's Listeners: `listen` records what it binds in `bound`."""

    def __init__(self, settings: Config, log: EventLog, tls: Tls | None = None) -> None:
        self.settings = settings
        self.log = log
        self.tls = tls  # --tls-cert: the contexts every listener serves with
        self.listeners: list[asyncio.AbstractServer] = []  # closed when the drain begins
        self.control_path = settings.control  # PATH, or PATH.<pid> beside a live server
        self.bound: dict[str, asyncio.AbstractServer] = {}  # listeners by name, to hand over
        self.inherited: dict[str, socket.socket] = {}  # handed over by the server beside us
        self.http_state: HttpServerState | None = None
        self.operator_state: HttpServerState | None = None  # --operator-port
        self.binary_state: BinaryServerState | None = None  # when the binary port is on
        self.grpc: GrpcPort | None = None  # when the gRPC port is on

    def http_states(self) -> list[HttpServerState]:
        return [s for s in (self.http_state, self.operator_state) if s is not None]

    def handover_sockets(self) -> tuple[list[str], list[int]]:
        return listening_fds(self)

    def stopping(self) -> None:
        """The stop began (a signal, or `drain`): every request already read is framed and
        admitted now, so that it counts as read before it; from here a 503 closes its HTTP
        connection."""
        for state in self.http_states():
            state.stopping = True
            state.frame_read()
        if self.binary_state is not None:
            self.binary_state.frame_read()

    def begin_drain(self, timeout_s: float) -> None:
        """Close the listeners and every idle connection; the rest close after their last
        answer (gRPC: GOAWAY, the calls in flight finish)."""
        for listener in self.listeners:
            listener.close()
        for state in self.http_states():
            state.begin_drain()
        if self.binary_state is not None:
            for bconn in list(self.binary_state.connections):
                bconn.end.drain()
        if self.grpc is not None:
            self.grpc.begin_drain(timeout_s)

    def owed(self) -> bool:
        """An answer unwritten or a request being read, on any connection."""
        if any(state.owed() for state in self.http_states()):
            return True
        if self.grpc is not None and self.grpc.inflight:
            return True
        bstate = self.binary_state
        return bstate is not None and any(c.owes() for c in bstate.connections)

    def close_connections(self) -> None:
        for state in self.http_states():
            for conn in list(state.connections):
                if conn.transport is not None:
                    conn.transport.close()
        if self.binary_state is not None:
            for bconn in list(self.binary_state.connections):
                bconn.close_now()

    def sweep(self, now: float, now_ns: int) -> None:
        """Close the connections past their read or keep-alive timeouts (gRPC's: its limits);
        refresh gRPC health."""
        for state in self.http_states():
            for conn in list(state.connections):
                conn.sweep(now_ns)
        if self.binary_state is not None:
            for bconn in list(self.binary_state.connections):
                bconn.end.sweep(now)
        if self.grpc is not None:
            self.grpc.update_health()
            self.grpc.limits.sweep(now_ns)

    def remove_control(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.control_path)
