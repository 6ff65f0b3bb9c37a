"""One HTTP/2 connection from a gRPC client, as an asyncio Protocol on the front-end's loop: its
life (preface, SETTINGS), the control frames, how much of it one loop turn reads (its read gate,
service/protocols/readgate.py), and how it ends (`Ending`: GOAWAY and the drain, connection
errors). The streams are streams.py's, the sending flow.py's, the wire
codec.py's; a frame that does no useful work is paid from the connection's budget
(service/protocols/budget.py), and a client that overdraws it is sent GOAWAY ENHANCE_YOUR_CALM
and closed, as nghttp2 and Go's http2 do since the 2023-2024 floods (docs/design.md, "gRPC")."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

import hpack
from ringserve.service.protocols.budget import Budget
from ringserve.service.protocols.readgate import LOST, WRITE_BLOCKED, ReadGate
from ringserve.service.protocols.rpc.http2.codec import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_LIST,
    HEADERS,
    INTERNAL_ERROR,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    H2Error,
    HeaderDecoder,
    frame,
    read_frames,
    read_preface,
)
from ringserve.service.protocols.rpc.http2.flow import Sender
from ringserve.service.protocols.rpc.http2.grpc import Port
from ringserve.service.protocols.rpc.http2.inflow import Inflow
from ringserve.service.protocols.rpc.http2.streams import StreamTable

DRAIN_PING = b"ringdrn!"
FRAMES_PER_TURN = 256  # read in one loop turn; more waits for the next (the others go first)
# The budget of frames that do no useful work: 1,000 at once, 100 a second after (nghttp2's
# reset budget is 1,000 and 33/s). A grpc client's pings, SETTINGS and cancels stay far below.
WASTE_BURST, WASTE_RATE = 1000, 100
CLOSE_WAIT_S = 1.0  # a connection error's GOAWAY waits this long for a peer that reads nothing


class Connection(asyncio.Protocol):
    """One HTTP/2 connection: its life, its frames read a turn at a time (what its read gate
    lets in), and its control frames. How it ends is `Ending`'s."""

    def __init__(self, port: Port, now_ns: Callable[[], int]) -> None:
        self.port = port
        self.now_ns = now_ns
        self.loop = asyncio.get_event_loop()
        self.transport: Any = None
        self.sender = Sender(self, self.loop, port.budget)
        self.inflow = Inflow(self.sender, port.budget, port.stream_window)
        self.table = StreamTable(self)
        self.decoder = HeaderDecoder()
        self.budget = Budget(WASTE_BURST, WASTE_RATE, now_ns)
        self.buf = bytearray()
        self.preface = False
        self.settled = False  # the client's first SETTINGS came
        self.gate = ReadGate(FRAMES_PER_TURN, self.work, loop=self.loop)
        self.end = Ending(self)

    # -- asyncio ----------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = self.sender.transport = transport
        self.gate.attach(transport)
        window = self.inflow.stream_window
        settings = struct.pack(
            ">HIHIHIHI", 3, self.port.max_streams, 4, window, 6, HEADER_LIST, 2, 0
        )
        self.sender.write(frame(SETTINGS, 0, 0, settings))
        self.sender.write(self.inflow.opening())
        self.port.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.pause(LOST)
        self.table.cancel_all()
        self.buf = bytearray()  # freed now: the connection's objects are a cycle for the gc
        self.inflow.waiting.clear()
        self.port.closed(self)

    def data_received(self, data: bytes) -> None:
        if self.lost:
            return
        self.buf += data
        if not self.gate.backlog:
            self.work()

    # -- what its read gate lets in ---------------------------------------------------------------
    @property
    def lost(self) -> bool:
        return self.gate.lost

    @property
    def backlog(self) -> bool:
        """Whole frames wait for the loop's next turn."""
        return self.gate.backlog

    @property
    def paused_writing(self) -> bool:
        """The client does not read what we send: nothing more is read from it until it does
        (its PINGs and SETTINGS cannot pile answers up here)."""
        return WRITE_BLOCKED in self.gate.why

    @property
    def reading(self) -> bool:
        return not self.gate.paused

    def pause_writing(self) -> None:
        self.gate.pause(WRITE_BLOCKED)

    def resume_writing(self) -> None:
        self.gate.resume(WRITE_BLOCKED)

    def work(self) -> None:
        """Read at most FRAMES_PER_TURN frames; with more buffered, read nothing from the socket
        and go on at the loop's next turn, after every other connection's ready work."""
        try:
            more = self.read_turn()
        except H2Error as exc:
            self.end.fail(exc.code, str(exc))
            return
        except hpack.HPACKError as exc:
            self.end.fail(COMPRESSION_ERROR, type(exc).__name__)
            return
        except Exception as exc:  # noqa: BLE001 - a bug of ours: this connection only ends
            self.port.broken(exc)
            self.end.fail(INTERNAL_ERROR, "internal error")
            return
        if more and not self.lost:
            self.gate.defer()

    def read_turn(self) -> bool:
        """One turn's frames; True when whole frames may still wait in the buffer."""
        if not self.preface:
            n = read_preface(self.buf)
            if not n:
                return False
            del self.buf[:n]
            self.preface = True
        quota = self.gate.per_turn
        frames = read_frames(self.buf, quota)
        for kind, flags, sid, payload in frames:
            if self.lost:
                return False
            self.on_frame(kind, flags, sid, payload)
        self.table.run_ends()
        return len(frames) == quota and len(self.buf) >= 9

    def eof_received(self) -> bool:
        return False  # close: a client that half-closes its TCP side is done

    # -- frames -----------------------------------------------------------------------------------
    def on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        table = self.table
        if table.pending is not None and (kind != CONTINUATION or sid != table.pending[0]):
            raise H2Error(PROTOCOL_ERROR, "a header block interrupted")
        if not self.settled:
            if kind != SETTINGS or flags & ACK:
                raise H2Error(PROTOCOL_ERROR, "the first frame must be SETTINGS")
            self.settled = True
        if kind == DATA:
            table.on_data(flags, sid, payload)
        elif kind == HEADERS:
            table.on_headers(flags, sid, payload)
        elif kind == CONTINUATION:
            table.on_continuation(flags, payload)
        elif kind == SETTINGS:
            if not flags & ACK:
                self.waste("SETTINGS frames")
            self.sender.on_settings(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self.sender.on_window_update(sid, payload)
        elif kind == PING:
            self.on_ping(flags, sid, payload)
        elif kind == RST_STREAM:
            table.on_reset(sid, payload)
        elif kind == PRIORITY:
            if not sid or len(payload) != 5:
                raise H2Error(PROTOCOL_ERROR if not sid else FRAME_SIZE_ERROR, "bad PRIORITY")
            self.waste("PRIORITY frames")
        elif kind == GOAWAY:
            if sid or len(payload) < 8:
                raise H2Error(PROTOCOL_ERROR, "bad GOAWAY")
            self.end.peer_gone = True
            self.end.maybe_close()
        elif kind == PUSH_PROMISE:
            raise H2Error(PROTOCOL_ERROR, "a client cannot push")
        else:
            self.waste("frames of unknown types", 1 + len(payload) / 4096)  # RFC 9113 4.1

    def on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid or len(payload) != 8:
            raise H2Error(PROTOCOL_ERROR if sid else FRAME_SIZE_ERROR, "bad PING")
        if not flags & ACK:
            self.waste("PING frames")
            self.sender.write(frame(PING, ACK, 0, payload))
        elif payload == DRAIN_PING and self.end.draining:
            self.end.final_goaway()

    def waste(self, what: str, cost: float = 1.0) -> None:
        """Pay for a frame that does no useful work; past the budget, the connection ends."""
        if not self.budget.spend(cost):
            raise H2Error(ENHANCE_YOUR_CALM, f"too many {what}")

    def begin_drain(self) -> None:
        """The port drains (Ending.drain)."""
        self.end.drain()


class Ending:
    """How one HTTP/2 connection ends: a connection error (GOAWAY with its code, then closed),
    the drain's two GOAWAYs, the close once no stream is left after the final GOAWAY or the
    client's, and the closes the port and the sweep decide (rpc/server.py, rpc/limits.py)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.goaway_at: int | None = None  # the last stream id the final GOAWAY let through
        self.draining = False
        self.peer_gone = False  # the client sent GOAWAY

    def fail(self, code: int, message: str) -> None:
        """A connection error: GOAWAY, then close (what is owed is dropped)."""
        conn = self.conn
        transport = conn.transport
        if conn.lost or transport is None:
            return
        debug = message.encode("utf-8", "replace")[:256]
        last = conn.table.last_id
        conn.sender.write(frame(GOAWAY, 0, 0, struct.pack(">II", last, code) + debug))
        conn.sender.flush()
        transport.close()
        if transport.get_write_buffer_size():  # a peer that reads nothing is not waited for
            conn.loop.call_later(CLOSE_WAIT_S, transport.abort)
        conn.gate.pause(LOST)
        conn.table.cancel_all()

    def drain(self) -> None:
        """GOAWAY in two steps (RFC 9113 6.8): first one that lets every stream through, and a
        PING; when its ACK is back, every stream the client sent before it has arrived, and the
        final GOAWAY names the last. Streams after it are not processed: clients retry them."""
        conn = self.conn
        if self.draining or conn.lost:
            return
        self.draining = True
        conn.sender.write(frame(GOAWAY, 0, 0, struct.pack(">II", MAX_WINDOW, NO_ERROR)))
        conn.sender.write(frame(PING, 0, 0, DRAIN_PING))

    def final_goaway(self) -> None:
        conn = self.conn
        if self.goaway_at is not None or conn.lost:
            return
        self.goaway_at = last = conn.table.last_id
        conn.sender.write(frame(GOAWAY, 0, 0, struct.pack(">II", last, NO_ERROR)))
        self.maybe_close()

    def maybe_close(self) -> None:
        conn = self.conn
        if conn.table.streams or conn.lost or conn.transport is None:
            return
        if self.goaway_at is not None or self.peer_gone:
            conn.sender.flush()
            conn.transport.close()

    def abort(self) -> None:
        conn = self.conn
        if conn.transport is not None and not conn.lost:
            conn.sender.flush()
            conn.transport.close()

    def drop(self) -> None:
        """A client that leaves our writes unread too long: closed with nothing more sent."""
        conn = self.conn
        if conn.transport is not None and not conn.lost:
            conn.transport.abort()
