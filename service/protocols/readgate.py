"""Why a connection's socket is not being read, and how much of it one loop turn frames: the one
read gate every protocol shares (STYLE.md lesson 30), so that each keeps only its framing.

A socket is read while no reason holds it. The transport is told only when that changes:
pausing twice for one reason is one pause, and reading resumes when the last reason goes. Three
reasons are for good (DRAINING, EOF, LOST: nothing more is framed), and after the last two the
transport is told nothing more (the client sends nothing more, or the connection is gone). A
read that frames the turn's quota with more left waits, the socket unread, for the loop's next
turn (the backlog), so one connection's burst cannot hold the loop from the others'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

WRITE_BLOCKED = "write-blocked"  # the client does not read our answers: its buffer is full
BACKLOG = "backlog"  # the turn's quota is framed: the rest waits for the loop's next turn
PIPELINE_FULL = "pipeline full"  # it owes as many answers as its protocol lets it owe
DRAINING = "draining"  # nothing more is framed: it closes after what it owes
EOF = "eof"  # the client sent its last byte
LOST = "lost"  # closed or closing, by either side
FOR_GOOD = frozenset({DRAINING, EOF, LOST})  # never resumed
SILENT = frozenset({EOF, LOST})  # the transport is told nothing more


class Reads(Protocol):
    """What the gate tells a transport (asyncio's, uvloop's, a test's)."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class ReadGate:
    """Why one connection is not read (`why`), and its turns. `next_turn` frames the backlog;
    `resumed` hears when reading resumes (a wait that was ours, not the client's)."""

    __slots__ = (
        "done", "dropping", "loop", "lost", "next_turn", "paused", "per_turn", "resumed",
        "silent", "transport", "why",
    )  # fmt: skip

    def __init__(
        self,
        per_turn: int = 0,
        next_turn: Callable[[], object] | None = None,
        resumed: Callable[[], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.per_turn = per_turn  # requests or frames one turn frames (0: no quota)
        self.next_turn = next_turn
        self.resumed = resumed
        self.loop = loop  # None: the loop running when a backlog is left
        self.transport: Reads | None = None
        self.why: set[str] = set()
        self.paused = False  # what the transport was last told
        self.done = self.lost = self.silent = False  # a FOR_GOOD reason, LOST, a SILENT one
        self.dropping = False  # read on and drop what comes, whatever the reasons

    def attach(self, transport: Reads) -> None:
        self.transport = transport
        self.tell()

    def pause(self, reason: str) -> None:
        if reason in self.why:
            return
        self.why.add(reason)
        if reason in FOR_GOOD:
            self.done = True
            self.lost = self.lost or reason == LOST
            self.silent = self.silent or reason in SILENT
        self.tell()

    def resume(self, reason: str) -> None:
        if reason in self.why and reason not in FOR_GOOD:
            self.why.discard(reason)
            self.tell()

    def drop_input(self) -> None:
        """Read on and drop what still comes: closing a socket with input unread sends a reset,
        which can erase answers the client has not read yet."""
        self.dropping = True
        self.tell()

    @property
    def backlog(self) -> bool:
        return BACKLOG in self.why

    def defer(self) -> None:
        """The turn's quota is framed and more is left: it waits for the loop's next turn."""
        if BACKLOG not in self.why:
            (self.loop or asyncio.get_running_loop()).call_soon(self.turn)
            self.pause(BACKLOG)

    def turn(self) -> None:
        """Frame the backlog: at the turn it waited for, or at once (the stop, the drain, an
        EOF), when the turn it waited for finds nothing left."""
        if BACKLOG in self.why:
            self.why.discard(BACKLOG)
            if self.next_turn is not None and not self.lost:
                self.next_turn()  # which may leave a backlog again
            self.tell()

    def tell(self) -> None:
        transport = self.transport
        if transport is None or self.silent:
            return
        read = self.dropping or not self.why
        if read == self.paused:  # a change
            self.paused = not read
            if read:
                transport.resume_reading()
                if self.resumed is not None:
                    self.resumed()
            else:
                transport.pause_reading()
