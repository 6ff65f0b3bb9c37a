"""A connection's calls (RFC 9113 5.1): streams opened by HEADERS (and their CONTINUATIONs),
their DATA, their ends (the client's half-close, its reset, or ours), and what is remembered of
streams that have ended, so that a late frame is told from a protocol error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ringserve.service.protocols.rpc.http2.codec import (
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    HEADER_LIST,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    STREAM_CLOSED,
    H2Error,
    HeaderDecoder,
    error_code,
    frame,
    strip,
)
from ringserve.service.protocols.rpc.http2.flow import Sender
from ringserve.service.protocols.rpc.http2.grpc import (
    INTERNAL,
    RESOURCE_EXHAUSTED,
    UNKNOWN,
    CallHead,
    CallHeads,
    Port,
    Stream,
    parse_timeout,
)
from ringserve.service.protocols.rpc.http2.inflow import Inflow

# How a stream ended, remembered for the REMEMBERED newest: frames that were in flight when we
# ended it are ignored; after the client's own END_STREAM or reset they are its error.
OURS, PEER_END, PEER_RESET = 0, 1, 2
REMEMBERED = 1024
MAX_CONTINUATIONS = 32  # in one header block (nghttp2 takes 8): more is a flood, not a header
RESET_IN_FLIGHT = 10  # the budget a reset costs when its call was still running


class Ends(Protocol):
    """What the stream table needs of how its connection ends (connection.Ending)."""

    goaway_at: int | None

    def maybe_close(self) -> None: ...


class Owner(Protocol):
    """What the stream table needs of its connection."""

    port: Port
    now_ns: Callable[[], int]

    @property
    def sender(self) -> Sender: ...
    @property
    def inflow(self) -> Inflow: ...
    @property
    def decoder(self) -> HeaderDecoder: ...
    @property
    def end(self) -> Ends: ...
    def waste(self, what: str, cost: float = 1.0) -> None: ...


class StreamTable:
    """The streams of one connection, and the frames that open, feed and end them."""

    def __init__(self, conn: Owner) -> None:
        self.conn = conn
        self.streams: dict[int, Stream] = {}
        self.last_id = 0  # the highest stream id the client opened
        self.pending: tuple[int, int, bytearray] | None = None  # HEADERS awaiting CONTINUATION
        self.continuations = 0  # in the pending header block
        self.ended: dict[int, int] = {}  # stream id: OURS, PEER_END or PEER_RESET
        self.ending: dict[int, Stream] = {}  # requests ended in this read, their calls to start
        self.heads = CallHeads()  # a repeated header list's call headers, read once

    # -- HEADERS --------------------------------------------------------------------------------
    def on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid or not sid & 1:
            raise H2Error(PROTOCOL_ERROR, "HEADERS on stream 0 or an even stream")
        block = strip(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise H2Error(PROTOCOL_ERROR, "short PRIORITY fields")
            block = block[5:]
        if flags & END_HEADERS:
            self.headers_done(sid, flags, block)
        else:
            self.pending, self.continuations = (sid, flags, bytearray(block)), 0

    def on_continuation(self, flags: int, payload: bytes) -> None:
        if self.pending is None:
            raise H2Error(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        self.conn.waste("CONTINUATION frames")
        self.continuations += 1
        if self.continuations > MAX_CONTINUATIONS:
            raise H2Error(ENHANCE_YOUR_CALM, "too many CONTINUATION frames in one header block")
        sid, first, block = self.pending
        block += payload
        if len(block) > HEADER_LIST:
            raise H2Error(PROTOCOL_ERROR, "header block too large")
        if flags & END_HEADERS:
            self.pending = None
            self.headers_done(sid, first, bytes(block))

    def headers_done(self, sid: int, flags: int, block: bytes) -> None:
        conn = self.conn
        fields = conn.decoder.decode(block)  # always: the HPACK table must follow
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: they end its side
            if stream.remote_closed:
                self.reset(stream, STREAM_CLOSED)
            elif not flags & END_STREAM:
                self.reset(stream, PROTOCOL_ERROR)
            else:
                self.remote_end(stream)
            return
        if sid <= self.last_id:
            self.late(sid, "HEADERS")
            return
        self.last_id = sid
        if conn.end.goaway_at is not None and sid > conn.end.goaway_at:
            self.remember(sid, OURS)  # after our GOAWAY: not processed, the client retries it
            return
        head = self.heads.read(fields)
        if len(self.streams) >= conn.port.max_streams or not conn.inflow.room(head[5]):
            conn.waste("streams over the limit")
            conn.sender.write(frame(RST_STREAM, 0, sid, error_code(REFUSED_STREAM)))
            self.remember(sid, OURS)
            return
        self.open(sid, flags, head)

    def open(self, sid: int, flags: int, head: CallHead) -> None:
        method, path, content_type, timeout, metadata, cost = head
        stream = Stream(self.conn, sid, path or b"", metadata)
        self.conn.inflow.open(stream, cost)
        self.streams[sid] = stream
        if method != b"POST" or not path:
            self.reset(stream, PROTOCOL_ERROR)
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            stream.finish(UNKNOWN, "content-type is not application/grpc")
            return
        if timeout is not None:
            ns = parse_timeout(timeout)
            if ns is None:
                stream.finish(INTERNAL, "malformed grpc-timeout")
                return
            stream.deadline_ns = self.conn.now_ns() + ns
        self.conn.port.begin(stream)
        if flags & END_STREAM:
            if sid in self.streams:
                self.remote_end(stream)
            else:  # answered at once, and the client had ended its side too
                self.remember(sid, PEER_END)

    # -- DATA -----------------------------------------------------------------------------------
    def on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        if sid > self.last_id:
            raise H2Error(PROTOCOL_ERROR, "DATA on an idle stream")
        conn, inflow = self.conn, self.conn.inflow
        n = len(payload)
        inflow.received(n)
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            inflow.give_back(n)
            self.late(sid, "DATA")
            return
        stream.window -= n
        inflow.promised -= n
        if stream.window < 0:
            inflow.give_back(n)
            self.reset(stream, FLOW_CONTROL_ERROR)
            return
        data = strip(flags, payload)
        if not data and not flags & END_STREAM:
            conn.waste("empty DATA frames")
        inflow.hold(stream, n, len(data))
        stream.take(data, conn.port.limit)
        if sid not in self.streams:
            return
        if flags & END_STREAM:
            self.remote_end(stream)
        elif inflow.spent() and not stream.done:  # every byte held, none can complete
            stream.finish(RESOURCE_EXHAUSTED, "over the connection's bytes of requests held")

    def late(self, sid: int, kind: str) -> None:
        """A frame for a stream that is not open. One we ended may still have frames in flight
        (ignored, within the budget); after the client's own END_STREAM it is a connection
        error; a HEADERS for an id never opened is one too (ids only grow), and DATA on a stream
        the client reset is a stream error (RFC 9113 5.1, 5.1.1)."""
        conn = self.conn
        stream = self.streams.get(sid)
        if stream is not None:  # half-closed (remote): the stream is reset
            conn.waste("frames on closed streams")
            self.reset(stream, STREAM_CLOSED)
            return
        how = self.ended.get(sid)
        if how == PEER_END:
            raise H2Error(STREAM_CLOSED, f"{kind} on a closed stream")
        if how != OURS and kind == "HEADERS":
            raise H2Error(PROTOCOL_ERROR, "HEADERS on a stream id lower than one already used")
        conn.waste("frames on closed streams")
        if how != OURS:
            conn.sender.write(frame(RST_STREAM, 0, sid, error_code(STREAM_CLOSED)))

    # -- ends -----------------------------------------------------------------------------------
    def remote_end(self, stream: Stream) -> None:
        stream.remote_closed = True
        self.conn.inflow.ended(stream)
        if stream.done:
            if stream.trailers is None:  # all sent: the stream is over
                self.close(stream, ours=False)
                self.conn.end.maybe_close()
            return
        if stream.buf:
            stream.finish(INTERNAL, "the request ended inside a message")
            return
        if stream.on_end is not None:
            self.ending[stream.id] = stream  # started by run_ends, after this read's frames

    def run_ends(self) -> None:
        """Start the calls whose request ended in this read: one the client reset in the same
        read (the Rapid Reset's way) never reaches admission."""
        if not self.ending:
            return
        ending, self.ending = self.ending, {}
        for sid, stream in ending.items():
            if self.streams.get(sid) is stream and not stream.done and stream.on_end is not None:
                self.conn.inflow.release(stream)  # consumed: the call has its message
                stream.on_end(stream)

    def on_reset(self, sid: int, payload: bytes) -> None:
        """The client's RST_STREAM. Every one counts against the budget, however the stream
        ended, and one whose call was still running counts RESET_IN_FLIGHT times: calls opened
        and reset at once cost us, not the client (the Rapid Reset)."""
        if not sid or len(payload) != 4:
            raise H2Error(PROTOCOL_ERROR if not sid else FRAME_SIZE_ERROR, "bad RST_STREAM")
        if sid > self.last_id:
            raise H2Error(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self.streams.get(sid)
        # A call still running when reset wastes its work too (admitted texts still run).
        in_flight = stream is not None and not stream.done and sid not in self.ending
        self.conn.waste("streams reset", RESET_IN_FLIGHT if in_flight else 1)
        if stream is not None:
            self.close(stream, ours=False, how=PEER_RESET)
            self.cancelled(stream)
            self.conn.end.maybe_close()

    def reset(self, stream: Stream, code: int) -> None:
        self.close(stream, ours=True)
        stream.done = True
        self.conn.sender.write(frame(RST_STREAM, 0, stream.id, error_code(code)))
        self.cancelled(stream)
        self.conn.end.maybe_close()

    def close(self, stream: Stream, ours: bool, how: int = PEER_END) -> None:
        """The stream leaves the table (`ours`: we ended it before the client did)."""
        self.streams.pop(stream.id, None)
        self.conn.sender.blocked.pop(stream.id, None)
        self.conn.sender.drop(stream)
        self.conn.inflow.closed(stream)
        self.remember(stream.id, OURS if ours else how)

    def remember(self, sid: int, how: int) -> None:
        ended = self.ended
        ended[sid] = how
        if len(ended) > REMEMBERED:
            del ended[next(iter(ended))]

    def cancelled(self, stream: Stream) -> None:
        stream.done = True
        if stream.on_cancel is not None:
            stream.on_cancel(stream)

    def cancel_all(self) -> None:
        streams, self.streams = list(self.streams.values()), {}
        for stream in streams:
            self.cancelled(stream)
            stream.buf, stream.out = bytearray(), bytearray()  # now, not at the next gc pass
