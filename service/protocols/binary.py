"""The framed binary TCP protocol: pipelined `u32 len | text | u64 tag` frames, answers by tag.

Each loop turn parses up to FRAMES_PER_TURN complete frames of the buffer (more wait for the
next turn, the socket unread). Valid frames are admitted to the dispatcher in groups of up to
`binary_group` (one admission and one answer write per group, not per frame); bad frames are
answered at once. While other clients' texts are in flight, a connection owes at most
`binary_max_owed` answers: a frame past that is read and answered status 2 (overloaded) at
once, as is one the queue has no room for, so no frame waits unseen in the socket. On an idle
server a pipelined burst is admitted up to the queue's own ceiling. Reading pauses while the
transport's write buffer is full: a client that does not read its answers. A length over
`max_frame`, or bad frames past the connection's budget (answered status 1), end the
connection once the answers already owed have been written. What the frames become (model,
admission, answers, traces) is binary_admit.py's.

A connection is a client (engine.clients): while other clients' texts are in flight its texts
hold at most their share of the queue (--client-queue-share), and when it is lost, those still
waiting for a worker are dropped. An EOF with answers owed is a half-close: the answers still go
out (its waiting texts meanwhile behind other clients'), unless the socket is found reset (the
client closed it: `peers.peer_gone`, asked after each answer written past the EOF and at each
sweep).
At the connection cap a client address gets its share (`peers.Seats`); an address past its
failed AUTH frames (--auth-failures) is closed without its key being checked.

A frame with tag 0 and the text `MODEL name[:version]` selects the connection's model for the
frames after it (status 0, or 5 for a model the server does not hold); without one, the only
loaded model serves. Each group of frames resolves its model when it is admitted, so frames for
a model unloaded since answer status 5.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, cast

from ringserve.service.engine.clients import Client
from ringserve.service.engine.tenants import Tenant
from ringserve.service.protocols.binary_admit import FrameAdmitter
from ringserve.service.protocols.budget import Budget
from ringserve.service.protocols.handover import Listeners, listen
from ringserve.service.protocols.peers import KeyFailures, Seats, check_soon, peer_gone, peer_of
from ringserve.service.protocols.readgate import EOF, LOST, WRITE_BLOCKED, ReadGate
from ringserve.service.request.texts import checked
from ringserve.service.views import FrontView
from ringserve.shm import layout as L
from ringserve.wire.frames import (
    LENGTH,
    TAG,
    parse_model_selection,
    status_answer,
)


class BinaryPorts(Listeners, Protocol):
    binary_state: BinaryServerState | None  # set here: the drain closes these connections


FRAMES_PER_TURN = 1024  # parsed in one loop turn; more waits for the next (others go first)
GARBAGE_BURST, GARBAGE_RATE = 1000, 100  # bad frames a connection may send (docs/design.md)


class BinaryServerState:
    """What every binary connection of one server shares."""

    def __init__(self, server: FrontView, failures: KeyFailures | None = None) -> None:
        self.server = server
        self.settings = server.settings
        self.connections: set[BinaryProtocol] = set()
        self.seats = Seats(server.settings.max_connections)  # the cap, by client address
        self.failures = failures  # failed AUTH frames by address (--auth-failures)
        self.refused = 0

    def frame_read(self) -> None:
        """Admit every whole frame already read but waiting for the loop's next turn, now
        (the stop: frames read before the signal are admitted before it counts)."""
        for conn in list(self.connections):
            conn.gate.turn()


async def start_binary(
    ports: BinaryPorts,
    server: FrontView,
    host: str,
    port: int,
    failures: KeyFailures | None = None,
) -> asyncio.AbstractServer:
    state = BinaryServerState(server, failures)
    ports.binary_state = state  # the drain closes these connections once answers are out
    return await listen(ports, "binary", lambda: BinaryProtocol(state), host, port, 2048)


class BinaryProtocol(asyncio.Protocol):
    """One connection: its life, its frames (what its read gate lets in: a client that reads
    our answers, the loop's turns), and where answers leave (`send`)."""

    def __init__(self, state: BinaryServerState) -> None:
        self.state = state
        self.server = state.server
        s = state.settings
        self.max_frame: int = s.max_frame
        self.max_owed: int = s.binary_max_owed
        self.group_size: int = s.binary_group
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.owed = 0  # frames admitted whose answer is not written yet
        self.stopped = False  # an oversize length was read: parse nothing more
        self.draining = False  # the server drains: answer what is owed, then close
        self.lingering = False  # answers sent and our side shut: dropping input until EOF
        self.linger_s: float = s.binary_linger_s
        self.linger_timer: asyncio.TimerHandle | None = None
        self.last_active = time.monotonic()
        self.partial_since = 0.0  # when an incomplete frame began waiting for its rest
        self.tenant: Tenant | None = None  # the key of the AUTH frame, for rate and priority
        self.admitter = FrameAdmitter(self, state.server, s.request_timeout_s, state.failures)
        self.garbage = Budget(GARBAGE_BURST, GARBAGE_RATE, time.monotonic_ns)
        self.gate = ReadGate(FRAMES_PER_TURN, self.parse_turn)
        self.peer = ""  # the client's address (peers.peer_of)
        self.client = Client()  # its texts in the queue: its share, dropped when it goes
        self.end = Closing(self)

    # -- connection -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        state = self.state
        self.peer = peer_of(transport)
        if not state.seats.take(self):
            state.refused += 1
            self.gate.pause(LOST)
            transport.close()
            return
        self.gate.attach(self.transport)
        self.draining = self.server.draining  # accepted late: answer what it sends, then close
        state.connections.add(self)

    @property
    def closed(self) -> bool:
        """Its transport is closed or closing: nothing more is written."""
        return self.gate.lost

    @property
    def eof(self) -> bool:
        """The client sent EOF: what is buffered is answered, then it closes."""
        return EOF in self.gate.why

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections.discard(self)
        self.state.seats.leave(self)
        self.gate.pause(LOST)
        self.buffer.clear()
        if self.client.texts:  # nobody reads these answers: what still waits is dropped
            self.server.admission.leave(self.client)
        if self.linger_timer is not None:
            self.linger_timer.cancel()

    def idle_since(self) -> float | None:
        """When it last did anything, if it owes nothing now (peers.Seats)."""
        busy = self.owed or self.buffer or self.closed or self.gate.backlog
        return None if busy else self.last_active

    def eof_received(self) -> bool:
        self.gate.pause(EOF)  # a partial frame left at EOF is never answered
        if self.client.texts:  # gone, or reading on: its waiting texts go behind the others'
            self.server.admission.behind(self.client)
        if self.lingering:
            return False  # the client has our answers and is done too: close
        return self.owed > 0 or self.gate.backlog  # keep the write side open for answers owed

    def pause_writing(self) -> None:
        self.gate.pause(WRITE_BLOCKED)

    def resume_writing(self) -> None:
        self.gate.resume(WRITE_BLOCKED)

    # -- frames ---------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed or self.stopped or self.lingering:
            return
        self.last_active = now = time.monotonic()
        self.buffer += data
        if self.gate.backlog:
            return  # parsed at the turn already asked for
        if self.admitter.keys is not None and not self.admitter.authenticate(self.buffer):
            self.partial_since = self.partial_since or now  # the read timeout
            return
        self.parse()
        if not self.buffer:
            self.partial_since = 0.0
        elif not self.partial_since:
            self.partial_since = now

    def parse_turn(self) -> None:
        """The turn the frames left in the buffer waited for (the gate's)."""
        self.parse()

    def parse(self) -> None:
        """Admit the complete frames buffered, FRAMES_PER_TURN at most in one loop turn (the
        rest waits for the next, the socket unread); past the owed bound, answer status 2 at
        once. A bad frame is answered status 1; past GARBAGE_BURST of them (refilled at
        GARBAGE_RATE a second), the connection is stopped: closed once its answers are out."""
        admitter = self.admitter
        buf = self.buffer
        pos, end, count, quota = 0, len(buf), 0, self.gate.per_turn
        texts: list[bytes] = []
        tags: list[int] = []
        bad: list[bytes] = []
        over: list[int] = []  # frames past the owed bound
        with memoryview(buf) as view:
            while end - pos >= 4:
                if count == quota:
                    self.gate.defer()
                    break
                count += 1
                (n,) = LENGTH.unpack_from(buf, pos)
                if n > self.max_frame:
                    self.stopped = True
                    break
                stop = pos + 4 + n + 8
                if stop > end:
                    break
                text = view[pos + 4 : pos + 4 + n].tobytes()
                (tag,) = TAG.unpack_from(buf, stop - 8)
                pos = stop
                selection = parse_model_selection(text) if tag == 0 else None
                if selection is not None:
                    if texts:  # the frames before it are for the model selected before
                        admitter.admit(texts, tags)
                        texts, tags = [], []
                    admitter.select(selection)
                elif checked(text)[1]:
                    bad.append(status_answer(tag, L.STATUS_BAD_REQUEST))
                    if not self.garbage.spend():
                        self.stopped = True
                        break
                elif self.owed + len(tags) >= self.max_owed and admitter.others_waiting(len(tags)):
                    over.append(tag)
                else:
                    texts.append(text)
                    tags.append(tag)
                    if len(tags) >= self.group_size:
                        admitter.admit(texts, tags)
                        texts, tags = [], []
        del buf[:pos]
        if texts:
            admitter.admit(texts, tags)
        if bad:
            self.send(b"".join(bad), 400, len(bad))
        if over:
            admitter.refuse(over)
        if self.stopped:
            buf.clear()
        self.close_when_done()
        if self.stopped:  # read on and drop what comes while answers are owed (Closing)
            self.gate.drop_input()

    def send(self, answers: bytes, code: int, n: int = 1) -> bool:
        """Write answers and count `n` of them under `code`: the one place binary answers
        leave. An answer that cannot be written (the connection is gone) is not counted."""
        if self.closed or self.transport is None:
            return False
        self.transport.write(answers)
        if n:
            self.server.count("binary", code, n, self.tenant)
        if self.eof:  # a closed socket answers this with a reset: ask soon after
            check_soon(self.end.check_peer)
        return True

    def close_when_done(self) -> None:
        self.end.when_done()

    def owes(self) -> bool:
        """Answers are still to be written on it (a lingering close owes nothing)."""
        return not self.closed and self.owed > 0

    def close_now(self) -> None:
        if not self.closed and self.transport is not None:
            self.gate.pause(LOST)
            self.transport.close()

    evict = close_now  # idle, to seat another client (peers.Seats)


class Closing:
    """How one binary connection ends: a frame slower than the read timeout, a long idle, a
    half-closed client found gone, an oversize length, EOF or the drain (closed once every
    owed answer is written)."""

    def __init__(self, conn: BinaryProtocol) -> None:
        self.conn = conn

    def sweep(self, now: float) -> None:
        """Close on a frame that arrives slower than the read timeout, or a long idle; drop a
        half-closed connection whose client is found gone."""
        conn = self.conn
        if conn.closed or self.check_peer():
            return
        s = conn.state.settings
        if conn.gate.paused or conn.owed or conn.eof:  # the wait is ours: restart its clock
            conn.partial_since = now if conn.buffer else 0.0
            return
        slow = bool(conn.partial_since) and now - conn.partial_since > s.read_timeout_s
        idle = not conn.owed and not conn.buffer and now - conn.last_active > s.keepalive_timeout_s
        if slow or idle:
            conn.close_now()

    def check_peer(self) -> bool:
        """A half-closed connection whose client is found gone (its socket answered our last
        write with a reset) is dropped: connection_lost drops its texts still waiting."""
        conn = self.conn
        if conn.closed or not (conn.eof and conn.owed) or not peer_gone(conn.transport):
            return False
        conn.gate.pause(LOST)
        conn.transport.abort()  # type: ignore[union-attr]
        return True

    def when_done(self) -> None:
        """After an oversize length, EOF or the drain: close once every owed answer is written."""
        conn = self.conn
        transport = conn.transport
        if not (conn.stopped or conn.eof or conn.draining) or conn.owed or conn.closed:
            return
        if conn.lingering or transport is None:
            return
        if conn.eof or not transport.can_write_eof():
            conn.gate.pause(LOST)
            transport.close()  # close() still sends what the write buffer holds
            return
        # A lingering close: a RST (closing with the client's bytes unread) could erase answers
        # the client has not read yet, so send FIN after them and drop input until its EOF.
        conn.lingering = True
        transport.write_eof()
        conn.gate.drop_input()
        loop = asyncio.get_running_loop()
        conn.linger_timer = loop.call_later(conn.linger_s, conn.close_now)

    def drain(self) -> None:
        """The server drains: an idle connection closes at once (as uvicorn and Go's Shutdown
        close theirs); one with answers owed closes after the last of them, frames read and
        waiting for a turn admitted and answered first."""
        conn = self.conn
        conn.draining = True
        conn.gate.turn()  # the frames waiting for a turn are admitted first
        if not conn.owed:
            conn.close_now()
        else:
            self.when_done()
