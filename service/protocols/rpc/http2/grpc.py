"""gRPC over HTTP/2: a call's stream (its request headers, its messages, how it is answered),
the length-prefixed message framing, grpc-timeout, and the response header blocks, each a
constant encoded once (literals without indexing: no dynamic table state to follow)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol

# gRPC status codes
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
RESOURCE_EXHAUSTED, FAILED_PRECONDITION, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 9, 12, 13, 14
UNAUTHENTICATED = 16
TIMEOUT_UNITS = {b"H": 3600 * 10**9, b"M": 60 * 10**9, b"S": 10**9, b"m": 10**6, b"u": 1000,
                 b"n": 1}  # fmt: skip
STREAM_WINDOW = 65535  # a stream's receive window to start (grpc's): more is granted (inflow.py)


def hpack_int(value: int, prefix: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with a `prefix`-bit prefix, OR-ed into `first`."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes([first | value])
    out = bytearray([first | top])
    value -= top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field literal without indexing, new name, no Huffman: no dynamic table state,
    so a block made of these is the same on every connection and can be encoded once."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


# `:status 200` (static index 8) and `content-type: application/grpc` (name: static index 31).
RESPONSE_HEAD = b"\x88" + hpack_int(31, 4) + hpack_int(16, 7) + b"application/grpc"
OK_TRAILERS = literal(b"grpc-status", b"0")


def percent_encode(message: str) -> bytes:
    """grpc-message's encoding: UTF-8, then %XX for bytes outside printable ASCII and '%'."""
    out = bytearray()
    for b in message.encode("utf-8", "replace")[:4096]:
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


def status_block(code: int, message: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    block = literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    for name, value in extra:
        block += literal(name.encode(), value.encode("latin-1", "replace"))
    return block


def parse_timeout(value: bytes) -> int | None:
    """grpc-timeout (`1234m`: at most 8 digits and a unit) in nanoseconds, else None."""
    unit = TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits or len(digits) > 8 or not digits.isdigit():
        return None
    return int(digits) * unit


class Port(Protocol):
    """What a connection needs of the gRPC port."""

    limit: int  # the largest request message taken (larger: RESOURCE_EXHAUSTED)
    max_streams: int
    budget: int  # bytes a connection holds of requests, and apart of unread answers
    stream_window: int  # each stream's receive window to start (more is granted)

    def opened(self, conn: Any) -> None: ...
    def broken(self, exc: Exception) -> None: ...  # a bug met on a connection, which is ended
    def begin(self, stream: Stream) -> None: ...
    def closed(self, conn: Any) -> None: ...


class Sends(Protocol):
    """What a stream needs of the connection's sending side (flow.Sender)."""

    @property
    def peer_window(self) -> int: ...
    def flush_stream(self, stream: Stream) -> None: ...
    def room(self, n: int) -> bool: ...  # n more bytes of answers within the budget
    def drop(self, stream: Stream) -> None: ...  # its answers unsent are dropped


class Holds(Protocol):
    """What a stream needs of the connection's receiving side (inflow.Inflow)."""

    @property
    def stream_window(self) -> int: ...
    def consume(self, stream: Stream, n: int) -> None: ...
    def release(self, stream: Stream) -> None: ...
    def want(self, stream: Stream, more: int) -> None: ...


class Owner(Protocol):
    """What a stream needs of its connection."""

    @property
    def sender(self) -> Sends: ...
    @property
    def inflow(self) -> Holds: ...
    def now_ns(self) -> int: ...
    def waste(self, what: str, cost: float = 1.0) -> None: ...  # the connection's budget


class Stream:
    """One call: its request headers, and how to answer it. The port sets `on_message` (each
    request message) and `on_end` (the client's half-close) in `Port.begin`, and `on_cancel`
    for a call that may outlive its client (a reset, a lost connection)."""

    __slots__ = (
        "buf",
        "conn",
        "deadline_ns",
        "done",
        "headed",
        "heads",
        "held",
        "id",
        "metadata",
        "on_cancel",
        "on_end",
        "on_message",
        "out",
        "path",
        "received",
        "remote_closed",
        "request",
        "send_window",
        "sent_head",
        "tenant",
        "trailers",
        "wanted",
        "window",
    )  # fmt: skip

    def __init__(self, conn: Owner, sid: int, path: bytes, metadata: list[tuple[str, str]]):
        self.conn, self.id, self.path, self.metadata = conn, sid, path, metadata
        self.deadline_ns: int | None = None  # from grpc-timeout, monotonic
        self.received = conn.now_ns()
        self.request: bytes | None = None  # a unary call's one message (the port's)
        self.buf = bytearray()  # request bytes not yet a whole message
        self.window = conn.inflow.stream_window  # what the client may still send on it
        self.held = 0  # its request bytes the connection holds (inflow.Inflow)
        self.wanted = 0  # more window asked for its message and not yet granted (Inflow.want)
        self.heads = 0  # its header list's cost while it is open (inflow.Inflow.open)
        self.tenant: Any = None  # the key's tenant, when the port checked one (rpc/server.py)
        self.send_window = conn.sender.peer_window
        self.remote_closed = False
        self.done = False  # the answer's trailers are made (sent or queued)
        self.headed = False  # the response HEADERS are made
        self.sent_head = False
        self.out = bytearray()  # DATA payload waiting for flow-control window
        self.trailers: bytes | None = None  # sent once `out` is
        self.on_message: Callable[[Stream, bytes], None] | None = None
        self.on_end: Callable[[Stream], None] | None = None
        self.on_cancel: Callable[[Stream], None] | None = None

    # -- the servicer's view (what it reads of grpcio's ServicerContext) --------------------------
    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def time_remaining(self) -> float | None:
        if self.deadline_ns is None:
            return None
        return (self.deadline_ns - self.conn.now_ns()) / 1e9

    # -- the request's messages -------------------------------------------------------------------
    def take(self, data: bytes, limit: int) -> None:
        """DATA bytes: each whole length-prefixed message to `on_message`; one too large
        (over `limit`) or compressed ends the call at once, whole or not. A message read and
        not kept (a streaming call's) is consumed: its bytes go back to the windows."""
        if self.done:  # answered already: the rest of its request is dropped
            self.conn.inflow.release(self)
            return
        if not self.buf and len(data) >= 5 and int.from_bytes(data[1:5]) == len(data) - 5:
            self.message(data, limit)  # one whole message in one frame: a unary call's way
            return
        buf = self.buf
        buf += data
        while len(buf) >= 5 and not self.done:
            size = int.from_bytes(buf[1:5])
            if size <= limit and not buf[0] and len(buf) < 5 + size:
                short = 5 + size - len(buf) - self.window  # past what it may send now
                if short > 0:
                    self.conn.inflow.want(self, short)
                return  # not whole yet
            framed = bytes(buf[: 5 + size])
            del buf[: 5 + size]
            self.message(framed, limit)

    def message(self, framed: bytes, limit: int) -> None:
        """One length-prefixed message (its 5-byte prefix, then at most its bytes)."""
        if self.done:
            return
        size = int.from_bytes(framed[1:5])
        if size > limit:
            self.finish(RESOURCE_EXHAUSTED, f"request message over {limit} bytes")
        elif framed[0]:
            self.finish(UNIMPLEMENTED, "compressed messages are not supported")
        elif self.on_message is not None:
            self.on_message(self, framed[5:])
            if self.request is None and not self.done:
                self.conn.inflow.consume(self, len(framed))

    # -- answering --------------------------------------------------------------------------------
    def send(self, message: bytes) -> None:
        """One response message; past the connection's budget of unread answers, the call
        ends RESOURCE_EXHAUSTED instead."""
        if self.done:
            return
        if not self.conn.sender.room(len(message) + 5):
            self.unread()
            return
        self.headed = True
        self.out += struct.pack(">BI", 0, len(message))
        self.out += message
        self.conn.sender.flush_stream(self)

    def finish(
        self, code: int = OK, message: str = "", extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """The trailers: status OK after the messages, or an error (trailers-only when nothing
        was sent)."""
        if self.done:
            return
        self.done = True
        if self.held:  # the rest of its request is moot
            self.conn.inflow.release(self)
        block = OK_TRAILERS if code == OK and not extra else status_block(code, message, extra)
        if not self.headed:
            block = RESPONSE_HEAD + block  # trailers-only
            self.headed = self.sent_head = True
        self.trailers = block
        self.conn.sender.flush_stream(self)

    def reply(self, message: bytes) -> None:
        """A unary answer: HEADERS, DATA and trailers in one write."""
        if self.done:
            return
        if not self.conn.sender.room(len(message) + 5):
            self.unread()
            return
        self.done = self.headed = True
        self.out += struct.pack(">BI", 0, len(message))
        self.out += message
        self.trailers = OK_TRAILERS
        self.conn.sender.flush_stream(self)

    def unread(self) -> None:
        """Its client leaves the connection's answers unread past the budget: what it has
        not sent is dropped, and it ends."""
        self.conn.sender.drop(self)
        self.finish(RESOURCE_EXHAUSTED, "over the connection's bytes of unread answers")


CallHead = tuple[bytes | None, bytes | None, bytes | None, bytes | None, list[tuple[str, str]], int]
HEAD_FIELD_COST = 160  # a metadata field's objects (two str, a tuple, a list slot), about


def call_headers(fields: list[tuple[bytes, bytes]]) -> CallHead:
    """A call's request headers: :method, :path, content-type, grpc-timeout, and the rest as
    metadata (str pairs, as grpcio's servicers read them; calls with the same header list share
    it, so nothing may change it); last, what the list costs to hold while the call is open."""
    method = path = content_type = timeout = None
    metadata: list[tuple[str, str]] = []
    cost = 0
    for name, value in fields:
        cost += len(name) + len(value) + HEAD_FIELD_COST
        if name[:1] == b":":
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = value
        else:
            metadata.append((name.decode("latin-1"), value.decode("latin-1")))
    return method, path, content_type, timeout, metadata, cost


class CallHeads:
    """The last header list read on a connection and its call headers: a client's repeated
    call decodes to the very list HeaderDecoder kept for it (codec.py), so they are read once."""

    def __init__(self) -> None:
        self.fields: list[tuple[bytes, bytes]] | None = None
        self.head: CallHead | None = None

    def read(self, fields: list[tuple[bytes, bytes]]) -> CallHead:
        if fields is not self.fields or self.head is None:
            self.fields, self.head = fields, call_headers(fields)
        return self.head
