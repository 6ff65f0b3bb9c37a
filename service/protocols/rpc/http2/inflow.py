"""What a client may send a connection, and what the connection holds of it (RFC 9113 5.2,
6.9). The connection's receive window is the port's budget (--grpc-buffer) and is refilled
only as request bytes are consumed (a message a streaming call has read, a unary call started
with its message, a stream ended), never as they arrive: so the request bytes one connection
holds never pass the budget, whatever it sends.

Each stream starts with 64 KiB (grpc's own default): a message that fits, as most calls' do,
needs nothing more. A larger one says its length in its first five bytes, and the stream is
granted the rest once everything already granted on the connection and held by it leaves room
for it (`want`); until then it waits, first come first served, rather than taking a share of
the window that it could not finish with. So many large messages sent at once, interleaved
frame by frame as nghttp2 sends them, complete a few at a time instead of each holding part
of the window and none completing. A client that still spends the whole window on parts (more
streams opened than the budget holds windows for, or parts never finished) has the stream
whose DATA spent it ended RESOURCE_EXHAUSTED, its bytes given back, so the others go on. The
open streams' header lists are held too, and a stream that would take them past the budget is
refused (docs/design.md, "gRPC", "Bounds")."""

from __future__ import annotations

import struct
from collections import deque
from typing import Protocol

from ringserve.service.protocols.rpc.http2.codec import (
    FLOW_CONTROL_ERROR,
    WINDOW_UPDATE,
    H2Error,
    frame,
)
from ringserve.service.protocols.rpc.http2.grpc import Stream

DEFAULT_WINDOW = 65535  # a window's size before SETTINGS and WINDOW_UPDATE (RFC 9113 6.9.2)


class Sink(Protocol):
    def write(self, data: bytes) -> None: ...


class Inflow:
    """A connection's receive windows and the request bytes it holds."""

    __slots__ = (
        "budget", "credit", "heads", "held", "out", "promised", "stream_window", "waiting",
        "window",
    )  # fmt: skip

    def __init__(self, out: Sink, budget: int, stream_window: int) -> None:
        self.out = out  # where WINDOW_UPDATEs are written (the connection's Sender)
        self.budget = budget  # the connection's window: the most request bytes held
        self.stream_window = stream_window  # each stream's to start (SETTINGS)
        self.window = DEFAULT_WINDOW  # what the client may still send on the connection
        self.held = 0  # request bytes received and not yet consumed
        self.credit = budget - DEFAULT_WINDOW  # consumed (or never used), not yet given back
        self.promised = 0  # what open streams may still send (their windows)
        self.waiting: deque[Stream] = deque()  # streams wanting more window, in order
        self.heads = 0  # the open streams' header lists (Stream.heads)

    def opening(self) -> bytes:
        """The connection-level WINDOW_UPDATE that opens the window to the budget."""
        self.window, self.credit = self.window + self.credit, 0
        return frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.window - DEFAULT_WINDOW))

    # -- what comes -------------------------------------------------------------------------------
    def received(self, n: int) -> None:
        """A DATA frame's flow-controlled length, against the connection's window."""
        self.window -= n
        if self.window < 0:
            raise H2Error(FLOW_CONTROL_ERROR, "over the connection window")

    def hold(self, stream: Stream, n: int, data: int) -> None:
        """A stream's DATA frame of `n` bytes (already off its window and `promised`), `data`
        of them its payload (the rest padding, given back at once)."""
        stream.held += n
        self.held += n
        if n != data:
            self.consume(stream, n - data)

    def spent(self) -> bool:
        """The connection's window is used up by bytes held: none can come to complete them."""
        return self.window <= 0 and self.held > 0

    # -- the streams' windows ---------------------------------------------------------------------
    def open(self, stream: Stream, heads: int) -> None:
        stream.heads = heads
        self.heads += heads
        self.promised += stream.window

    def room(self, heads: int) -> bool:
        """Whether a new stream's header list (its cost) keeps the connection's open header
        lists within the budget (a stream past it is refused)."""
        return self.heads + heads <= self.budget

    def want(self, stream: Stream, more: int) -> None:
        """The stream needs `more` window than it has to finish its message: granted now if
        what is held and promised leaves room, else once it does, in turn."""
        if more <= stream.wanted:
            return
        if not stream.wanted:  # not waiting yet (wanted > 0: in `waiting`)
            self.waiting.append(stream)
        stream.wanted = more
        self.serve()

    def serve(self) -> None:
        """Grant the waiting streams their windows, in order, while they fit."""
        waiting = self.waiting
        while waiting:
            stream = waiting[0]
            if stream.done or stream.remote_closed or not stream.wanted:
                waiting.popleft()
                stream.wanted = 0
                continue
            if self.held + self.promised + stream.wanted > self.budget:
                return
            waiting.popleft()
            more, stream.wanted = stream.wanted, 0
            stream.window += more
            self.promised += more
            self.out.write(frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">I", more)))

    def ended(self, stream: Stream) -> None:
        """The client ended its side of the stream (or it closed): nothing more is promised
        it. `promised` is the sum of the windows of the streams the client may send on."""
        self.promised -= stream.window
        stream.window = 0

    # -- what is consumed -------------------------------------------------------------------------
    def give_back(self, n: int) -> None:
        """Bytes the connection took and holds no longer (or a frame for an ended stream)."""
        self.credit += n
        if self.credit >= self.budget >> 2 or self.window < self.budget >> 1:
            self.window += self.credit
            self.out.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.credit)))
            self.credit = 0

    def consume(self, stream: Stream, n: int) -> None:
        """`n` of the stream's held bytes are consumed: the connection's window gets them back;
        a stream the client may still send on is topped up to its starting window, in turn."""
        stream.held -= n
        self.held -= n
        self.give_back(n)
        if not (stream.remote_closed or stream.done) and stream.window < self.stream_window >> 1:
            self.want(stream, self.stream_window - stream.window)
        elif self.waiting:
            self.serve()

    def release(self, stream: Stream) -> None:
        """Everything the stream holds: it ended, or its call started with its message."""
        if stream.held:
            self.consume(stream, stream.held)
        stream.buf.clear()

    def closed(self, stream: Stream) -> None:
        if not stream.remote_closed:
            self.ended(stream)
        stream.wanted = 0
        self.release(stream)
        self.heads -= stream.heads
        stream.heads = 0
