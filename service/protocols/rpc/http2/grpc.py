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
WINDOW = 1 << 22  # our receive window, per stream and for the connection (4 MiB)


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

    def opened(self, conn: Any) -> None: ...
    def broken(self, exc: Exception) -> None: ...  # a bug met on a connection, which is ended
    def begin(self, stream: Stream) -> None: ...
    def closed(self, conn: Any) -> None: ...


class Sends(Protocol):
    """What a stream needs of the connection's sending side (flow.Sender)."""

    @property
    def peer_window(self) -> int: ...
    def flush_stream(self, stream: Stream) -> None: ...


class Owner(Protocol):
    """What a stream needs of its connection."""

    @property
    def sender(self) -> Sends: ...
    def now_ns(self) -> int: ...


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
        "trailers",
        "window",
    )  # fmt: skip

    def __init__(self, conn: Owner, sid: int, path: bytes, metadata: list[tuple[str, str]]):
        self.conn, self.id, self.path, self.metadata = conn, sid, path, metadata
        self.deadline_ns: int | None = None  # from grpc-timeout, monotonic
        self.received = conn.now_ns()
        self.request: bytes | None = None  # a unary call's one message (the port's)
        self.buf = bytearray()  # request bytes not yet a whole message
        self.window = WINDOW  # what the client may still send on this stream
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
        (over `limit`) or compressed ends the call at once, whole or not."""
        if not self.buf and len(data) >= 5 and int.from_bytes(data[1:5]) == len(data) - 5:
            self.message(data, limit)  # one whole message in one frame: a unary call's way
            return
        buf = self.buf
        buf += data
        while len(buf) >= 5 and not self.done:
            size = int.from_bytes(buf[1:5])
            if size <= limit and not buf[0] and len(buf) < 5 + size:
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

    # -- answering --------------------------------------------------------------------------------
    def send(self, message: bytes) -> None:
        """One response message."""
        if self.done:
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
        self.done = self.headed = True
        self.out += struct.pack(">BI", 0, len(message))
        self.out += message
        self.trailers = OK_TRAILERS
        self.conn.sender.flush_stream(self)


CallHead = tuple[bytes | None, bytes | None, bytes | None, bytes | None, list[tuple[str, str]]]


def call_headers(fields: list[tuple[bytes, bytes]]) -> CallHead:
    """A call's request headers: :method, :path, content-type, grpc-timeout, and the rest as
    metadata (str pairs, as grpcio's servicers read them; calls with the same header list share
    it, so nothing may change it)."""
    method = path = content_type = timeout = None
    metadata: list[tuple[str, str]] = []
    for name, value in fields:
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
    return method, path, content_type, timeout, metadata


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
