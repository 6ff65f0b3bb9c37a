"""What a connection sends, and as fast as the client lets it: the write buffer (one write a loop
turn, so the answers of one batch leave together), the send windows (the connection's and each
stream's), the client's SETTINGS, and its WINDOW_UPDATEs (RFC 9113 5.2, 6.5, 6.9). Answers the
client has not read, waiting for its windows or in the transport's buffer once it stops reading
us, are held up to the port's budget; an answer past it ends its call (Stream.unread)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Protocol

from ringserve.service.protocols.rpc.http2.codec import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE,
    FRAME_SIZE_ERROR,
    HEADERS,
    MAX_WINDOW,
    NO_ERROR,
    PROTOCOL_ERROR,
    RST_STREAM,
    SETTINGS,
    H2Error,
    error_code,
    frame,
)
from ringserve.service.protocols.rpc.http2.grpc import RESPONSE_HEAD, Stream


class Table(Protocol):
    """What sending needs of the stream table (streams.StreamTable)."""

    streams: dict[int, Stream]
    last_id: int

    def close(self, stream: Stream, ours: bool) -> None: ...
    def reset(self, stream: Stream, code: int) -> None: ...


class Ends(Protocol):
    def maybe_close(self) -> None: ...  # connection.Ending's: closed once no stream is left


class Owner(Protocol):
    """What sending needs of its connection."""

    @property
    def lost(self) -> bool: ...
    @property
    def paused_writing(self) -> bool: ...
    @property
    def table(self) -> Table: ...
    @property
    def end(self) -> Ends: ...


class Sender:
    """The connection's outgoing side."""

    def __init__(self, conn: Owner, loop: asyncio.AbstractEventLoop, budget: int) -> None:
        self.conn = conn
        self.budget = budget  # the most bytes of answers held unread
        self.unread = 0  # bytes of answers in the streams' `out`, not yet written
        self.loop = loop
        self.transport: Any = None
        self.wbuf: list[bytes] = []
        self.flush_due = False
        self.peer_window = 65535  # the client's initial stream window (SETTINGS)
        self.send_window = 65535  # connection send window
        self.max_frame = FRAME_SIZE  # the client's
        self.blocked: dict[int, Stream] = {}  # streams waiting for connection window

    def write(self, data: bytes) -> None:
        self.wbuf.append(data)
        if not self.flush_due:
            self.flush_due = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """One write for everything made since the last: answers of one batch go out together."""
        self.flush_due = False
        if self.transport is not None and not self.conn.lost and self.wbuf:
            self.transport.write(b"".join(self.wbuf))
        self.wbuf.clear()

    def room(self, n: int) -> bool:
        """Whether `n` more bytes of answers stay within the budget (counted if they do), with
        the transport's buffer once the client stops reading it."""
        held = self.unread + n
        if self.conn.paused_writing and self.transport is not None:
            held += self.transport.get_write_buffer_size()
        if held > self.budget:
            return False
        self.unread += n
        return True

    def drop(self, stream: Stream) -> None:
        self.unread -= len(stream.out)
        stream.out.clear()

    def flush_stream(self, stream: Stream) -> None:
        """Send what the stream has, as far as both windows allow; its trailers when all is out."""
        conn = self.conn
        if conn.lost or conn.table.streams.get(stream.id) is not stream:
            return
        out = []
        if not stream.sent_head and stream.headed:
            stream.sent_head = True
            out.append(frame(HEADERS, END_HEADERS, stream.id, RESPONSE_HEAD))
        while stream.out:
            n = min(len(stream.out), stream.send_window, self.send_window, self.max_frame)
            if n <= 0:
                if self.send_window <= 0:
                    self.blocked[stream.id] = stream
                break
            if n == len(stream.out):  # all of it (a unary answer): one copy, no slice
                chunk = bytes(stream.out)
                stream.out.clear()
            else:
                chunk = bytes(stream.out[:n])
                del stream.out[:n]
            out.append(frame(DATA, 0, stream.id, chunk))
            stream.send_window -= n
            self.send_window -= n
            self.unread -= n
        if not stream.out and stream.trailers is not None:
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, stream.trailers))
            stream.trailers = None
            if not stream.remote_closed:  # the answer is whole: the rest of the request is moot
                out.append(frame(RST_STREAM, 0, stream.id, error_code(NO_ERROR)))
            conn.table.close(stream, ours=not stream.remote_closed)
        if out:
            self.write(b"".join(out))
        conn.end.maybe_close()

    def on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2Error(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise H2Error(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        streams = self.conn.table.streams
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == 2 and value > 1:
                raise H2Error(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
            if key == 4:
                if value > MAX_WINDOW:
                    raise H2Error(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta, self.peer_window = value - self.peer_window, value
                for stream in streams.values():
                    stream.send_window += delta
            elif key == 5:
                if not FRAME_SIZE <= value <= 2**24 - 1:
                    raise H2Error(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.max_frame = value
        self.write(frame(SETTINGS, ACK, 0))
        for stream in list(streams.values()):
            if stream.out or stream.trailers is not None:
                self.flush_stream(stream)

    def on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "WINDOW_UPDATE length not 4")
        inc = int.from_bytes(payload) & MAX_WINDOW
        if not sid:
            if not inc:
                raise H2Error(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise H2Error(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            blocked, self.blocked = list(self.blocked.values()), {}
            for stream in blocked:
                self.flush_stream(stream)
            return
        table = self.conn.table
        if sid > table.last_id:
            raise H2Error(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
        found = table.streams.get(sid)
        if found is None:
            return  # a closed stream: allowed for a while after its end (RFC 9113 6.9)
        stream = found
        if not inc:
            table.reset(stream, PROTOCOL_ERROR)
            return
        stream.send_window += inc
        if stream.send_window > MAX_WINDOW:
            table.reset(stream, FLOW_CONTROL_ERROR)
            return
        self.flush_stream(stream)
