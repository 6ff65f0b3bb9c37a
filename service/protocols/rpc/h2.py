"""gRPC's HTTP/2, server side, as an asyncio Protocol on the front-end's own loop: framing, flow
control, streams, GOAWAY, and gRPC's message framing and trailers. HPACK decoding is the `hpack`
package's (its dynamic table and Huffman code); everything else is written here, for the cost
of a call (docs/design.md, "gRPC"): a unary call is one HEADERS and one DATA frame in, and one
write out (HEADERS, DATA and trailers, each response header block a constant encoded once).

What a call does with its request is the port's (rpc/server.py): `Port.begin` is given each new
stream once its headers are in, and the stream's `on_message` each request message. Any frame
that breaks the protocol ends its connection with GOAWAY (RFC 9113's connection errors) or its
stream with RST_STREAM; nothing a peer sends raises out of `data_received`.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, Protocol, cast

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = range(9)
CONTINUATION = 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# Error codes (RFC 9113 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11
# A connection whose client has reset more calls than this, and more than half of all it opened,
# ends with ENHANCE_YOUR_CALM (the "rapid reset" pattern: each call started costs us work).
RESETS = 1000
MAX_WINDOW = 2**31 - 1
FRAME_SIZE = 16384  # the largest frame we take (the default; we never raise it)
WINDOW = 1 << 22  # our receive window, per stream and for the connection (4 MiB)
HEADER_LIST = 65536  # the largest decoded header list we take
DRAIN_PING = b"ringdrn!"
# gRPC status codes
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
RESOURCE_EXHAUSTED, FAILED_PRECONDITION, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 9, 12, 13, 14
UNAUTHENTICATED = 16
TIMEOUT_UNITS = {b"H": 3600 * 10**9, b"M": 60 * 10**9, b"S": 10**9, b"m": 10**6, b"u": 1000,
                 b"n": 1}  # fmt: skip


class H2Error(Exception):
    """A connection error: GOAWAY with `code`, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream) + payload


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

    def opened(self, conn: Connection) -> None: ...
    def broken(self, exc: Exception) -> None: ...  # a bug met on a connection, which is ended
    def begin(self, stream: Stream) -> None: ...
    def closed(self, conn: Connection) -> None: ...


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

    def __init__(self, conn: Connection, sid: int, path: bytes, metadata: list[tuple[str, str]]):
        self.conn, self.id, self.path, self.metadata = conn, sid, path, metadata
        self.deadline_ns: int | None = None  # from grpc-timeout, monotonic
        self.received = conn.now_ns()
        self.request: bytes | None = None  # a unary call's one message (the port's)
        self.buf = bytearray()  # request bytes not yet a whole message
        self.window = WINDOW  # what the client may still send on this stream
        self.send_window = conn.peer_window
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

    # -- answering --------------------------------------------------------------------------------
    def send(self, message: bytes) -> None:
        """One response message."""
        if self.done:
            return
        self.headed = True
        self.out += struct.pack(">BI", 0, len(message))
        self.out += message
        self.conn.flush_stream(self)

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
        self.conn.flush_stream(self)

    def reply(self, message: bytes) -> None:
        """A unary answer: HEADERS, DATA and trailers in one write."""
        if self.done:
            return
        self.done = self.headed = True
        self.out += struct.pack(">BI", 0, len(message))
        self.out += message
        self.trailers = OK_TRAILERS
        self.conn.flush_stream(self)


class Connection(asyncio.Protocol):
    """One HTTP/2 connection from a gRPC client."""

    def __init__(self, port: Port, now_ns: Callable[[], int]) -> None:
        self.port = port
        self.now_ns = now_ns
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.preface = False
        self.settled = False  # the client's first SETTINGS came
        self.decoder = hpack.Decoder(max_header_list_size=HEADER_LIST)
        self.known: dict[bytes, list[tuple[bytes, bytes]]] = {}  # indexed-only blocks, decoded
        self.loop = asyncio.get_event_loop()
        self.streams: dict[int, Stream] = {}
        self.last_id = 0  # the highest stream id the client opened
        self.pending: tuple[int, int, bytearray] | None = None  # HEADERS awaiting CONTINUATION
        self.window = WINDOW  # connection receive window left
        self.peer_window = 65535  # the client's initial stream window (SETTINGS)
        self.send_window = 65535  # connection send window
        self.max_frame = FRAME_SIZE  # the client's
        self.blocked: dict[int, Stream] = {}  # streams waiting for connection window
        self.wbuf: list[bytes] = []
        self.flush_due = False
        self.goaway_at: int | None = None  # the last stream id the final GOAWAY let through
        self.draining = False
        self.peer_gone = False  # the client sent GOAWAY
        self.resets = 0  # open streams the client reset
        self.lost = False

    # -- asyncio ----------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        settings = struct.pack(
            ">HIHIHIHI", 3, self.port.max_streams, 4, WINDOW, 6, HEADER_LIST, 2, 0
        )
        self.write(frame(SETTINGS, 0, 0, settings))
        self.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW - 65535)))
        self.port.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        streams, self.streams = list(self.streams.values()), {}
        for stream in streams:
            self.cancelled(stream)
        self.port.closed(self)

    def data_received(self, data: bytes) -> None:
        if self.lost:
            return
        self.buf += data
        try:
            self.read_frames()
        except H2Error as exc:
            self.fail(exc.code, str(exc))
        except hpack.HPACKError as exc:
            self.fail(COMPRESSION_ERROR, type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: this connection only ends
            self.port.broken(exc)
            self.fail(INTERNAL_ERROR, "internal error")

    def pause_writing(self) -> None:
        """The client does not read what we send: read nothing more from it until it does."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False  # close: a client that half-closes its TCP side is done

    # -- reading ----------------------------------------------------------------------------------
    def read_frames(self) -> None:
        buf = self.buf
        pos = 0
        if not self.preface:
            if len(buf) < 24:
                if not PREFACE.startswith(bytes(buf)):
                    raise H2Error(PROTOCOL_ERROR, "not an HTTP/2 preface")
                return
            if buf[:24] != PREFACE:
                raise H2Error(PROTOCOL_ERROR, "not an HTTP/2 preface")
            self.preface = True
            pos = 24
        end = len(buf)
        try:
            while end - pos >= 9 and not self.lost:
                n = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if n > FRAME_SIZE:
                    raise H2Error(FRAME_SIZE_ERROR, "frame over SETTINGS_MAX_FRAME_SIZE")
                if end - pos < 9 + n:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                sid = int.from_bytes(buf[pos + 5 : pos + 9]) & MAX_WINDOW
                with memoryview(buf) as view:  # one copy (a bytearray slice would be two)
                    payload = bytes(view[pos + 9 : pos + 9 + n])
                pos += 9 + n
                self.on_frame(kind, flags, sid, payload)
        finally:
            del buf[:pos]

    def on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self.pending is not None and (kind != CONTINUATION or sid != self.pending[0]):
            raise H2Error(PROTOCOL_ERROR, "a header block interrupted")
        if not self.settled:
            if kind != SETTINGS or flags & ACK:
                raise H2Error(PROTOCOL_ERROR, "the first frame must be SETTINGS")
            self.settled = True
        if kind == DATA:
            self.on_data(flags, sid, payload)
        elif kind == HEADERS:
            self.on_headers(flags, sid, payload)
        elif kind == CONTINUATION:
            if self.pending is None:
                raise H2Error(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            _, first, block = self.pending
            block += payload
            if len(block) > HEADER_LIST:
                raise H2Error(PROTOCOL_ERROR, "header block too large")
            if flags & END_HEADERS:
                self.pending = None
                self.headers_done(sid, first, bytes(block))
        elif kind == SETTINGS:
            self.on_settings(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self.on_window_update(sid, payload)
        elif kind == PING:
            if sid or len(payload) != 8:
                raise H2Error(PROTOCOL_ERROR if sid else FRAME_SIZE_ERROR, "bad PING")
            if not flags & ACK:
                self.write(frame(PING, ACK, 0, payload))
            elif payload == DRAIN_PING and self.draining:
                self.final_goaway()
        elif kind == RST_STREAM:
            if not sid or len(payload) != 4:
                raise H2Error(PROTOCOL_ERROR if not sid else FRAME_SIZE_ERROR, "bad RST_STREAM")
            if sid > self.last_id:
                raise H2Error(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            stream = self.streams.pop(sid, None)
            if stream is not None:
                self.blocked.pop(sid, None)
                self.cancelled(stream)
                self.resets += 1  # calls opened and reset at once cost us, not the client
                if self.resets > RESETS and self.resets * 2 > (self.last_id + 1) // 2:
                    raise H2Error(ENHANCE_YOUR_CALM, "too many streams reset")
                self.maybe_close()
        elif kind == PRIORITY:
            if not sid or len(payload) != 5:
                raise H2Error(PROTOCOL_ERROR if not sid else FRAME_SIZE_ERROR, "bad PRIORITY")
        elif kind == GOAWAY:
            if sid or len(payload) < 8:
                raise H2Error(PROTOCOL_ERROR, "bad GOAWAY")
            self.peer_gone = True
            self.maybe_close()
        elif kind == PUSH_PROMISE:
            raise H2Error(PROTOCOL_ERROR, "a client cannot push")
        # any other type: ignored (RFC 9113 4.1)

    def strip(self, flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise H2Error(PROTOCOL_ERROR, "padding too long")
            return payload[1 : len(payload) - payload[0]]
        return payload

    def on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid or not sid & 1:
            raise H2Error(PROTOCOL_ERROR, "HEADERS on stream 0 or an even stream")
        block = self.strip(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise H2Error(PROTOCOL_ERROR, "short PRIORITY fields")
            block = block[5:]
        if flags & END_HEADERS:
            self.headers_done(sid, flags, block)
        else:
            self.pending = (sid, flags, bytearray(block))

    def headers_done(self, sid: int, flags: int, block: bytes) -> None:
        fields = self.decode(block)
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: they end its side
            if not flags & END_STREAM:
                self.reset(stream, PROTOCOL_ERROR)
            else:
                self.remote_end(stream)
            return
        if sid <= self.last_id:
            return  # a stream we closed already (a reset, a finished answer)
        self.last_id = sid
        if self.goaway_at is not None and sid > self.goaway_at:
            return  # after our GOAWAY: not processed, the client retries it elsewhere
        if len(self.streams) >= self.port.max_streams:
            self.write(frame(RST_STREAM, 0, sid, struct.pack(">I", REFUSED_STREAM)))
            return
        method = path = content_type = None
        timeout: bytes | None = None
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
        stream = Stream(self, sid, path or b"", metadata)
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
            stream.deadline_ns = self.now_ns() + ns
        self.port.begin(stream)
        if flags & END_STREAM and sid in self.streams:
            self.remote_end(stream)

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The block's header fields. A block of one-byte indexed fields only (a client's
        repeated call: every header already in the tables) changes no table, so its fields are
        kept and reused while the dynamic table stays as it is; any other block may change it,
        and empties what was kept."""
        indexed = all(b > 0x80 and b != 0xFF for b in block)
        if indexed:
            kept = self.known.get(block)
            if kept is not None:
                return kept
        else:
            self.known.clear()
        # always: the dynamic table must follow (raw: each field a (bytes, bytes) pair)
        fields = cast(list[tuple[bytes, bytes]], self.decoder.decode(block, raw=True))
        if indexed and len(self.known) < 64:
            self.known[block] = fields
        return fields

    def on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        if sid > self.last_id:
            raise H2Error(PROTOCOL_ERROR, "DATA on an idle stream")
        n = len(payload)
        self.window -= n
        if self.window < 0:
            raise H2Error(FLOW_CONTROL_ERROR, "over the connection window")
        if self.window < WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW - self.window)))
            self.window = WINDOW
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            return  # closed by us (or never taken): ignored
        stream.window -= n
        if stream.window < 0:
            self.reset(stream, FLOW_CONTROL_ERROR)
            return
        data = self.strip(flags, payload)
        whole = not stream.buf and len(data) >= 5 and int.from_bytes(data[1:5]) == len(data) - 5
        if whole:
            self.message(stream, data)  # one whole message in one frame: a unary call's way
        elif data:
            stream.buf += data
            self.messages(stream)
        if stream.id not in self.streams:
            return
        if flags & END_STREAM:
            self.remote_end(stream)
        elif stream.window < WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", WINDOW - stream.window)))
            stream.window = WINDOW

    def messages(self, stream: Stream) -> None:
        """gRPC's length-prefixed messages out of the stream's bytes."""
        buf = stream.buf
        while len(buf) >= 5 and not stream.done:
            size = int.from_bytes(buf[1:5])
            if size <= self.port.limit and not buf[0] and len(buf) < 5 + size:
                return  # not whole yet (one too large or compressed is refused at once)
            framed = bytes(buf[: 5 + size])
            del buf[: 5 + size]
            self.message(stream, framed)

    def message(self, stream: Stream, framed: bytes) -> None:
        """One length-prefixed message (its 5-byte prefix, then at most its bytes)."""
        if stream.done:
            return
        size = int.from_bytes(framed[1:5])
        if size > self.port.limit:
            stream.finish(RESOURCE_EXHAUSTED, f"request message over {self.port.limit} bytes")
        elif framed[0]:
            stream.finish(UNIMPLEMENTED, "compressed messages are not supported")
        elif stream.on_message is not None:
            stream.on_message(stream, framed[5:])

    def remote_end(self, stream: Stream) -> None:
        stream.remote_closed = True
        if stream.done:
            if stream.trailers is None:  # all sent: the stream is over
                self.streams.pop(stream.id, None)
                self.maybe_close()
            return
        if stream.buf:
            stream.finish(INTERNAL, "the request ended inside a message")
            return
        if stream.on_end is not None:
            stream.on_end(stream)

    def on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2Error(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise H2Error(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == 2 and value > 1:
                raise H2Error(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
            if key == 4:
                if value > MAX_WINDOW:
                    raise H2Error(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta, self.peer_window = value - self.peer_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == 5:
                if not FRAME_SIZE <= value <= 2**24 - 1:
                    raise H2Error(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.max_frame = value
        self.write(frame(SETTINGS, ACK, 0))
        for stream in list(self.streams.values()):
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
        if sid > self.last_id:
            raise H2Error(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
        found = self.streams.get(sid)
        if found is None:
            return
        stream = found
        if not inc:
            self.reset(stream, PROTOCOL_ERROR)
            return
        stream.send_window += inc
        if stream.send_window > MAX_WINDOW:
            self.reset(stream, FLOW_CONTROL_ERROR)
            return
        self.flush_stream(stream)

    # -- writing ----------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.wbuf.append(data)
        if not self.flush_due:
            self.flush_due = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """One write for everything made since the last: answers of one batch go out together."""
        self.flush_due = False
        if self.transport is not None and not self.lost and self.wbuf:
            self.transport.write(b"".join(self.wbuf))
        self.wbuf.clear()

    def flush_stream(self, stream: Stream) -> None:
        """Send what the stream has, as far as both windows allow; its trailers when all is out."""
        if self.lost or self.streams.get(stream.id) is not stream:
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
        if not stream.out and stream.trailers is not None:
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, stream.trailers))
            stream.trailers = None
            if not stream.remote_closed:  # the answer is whole: the rest of the request is moot
                out.append(frame(RST_STREAM, 0, stream.id, struct.pack(">I", NO_ERROR)))
            self.streams.pop(stream.id, None)
            self.blocked.pop(stream.id, None)
        if out:
            self.write(b"".join(out))
        self.maybe_close()

    def reset(self, stream: Stream, code: int) -> None:
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        stream.done = True
        self.write(frame(RST_STREAM, 0, stream.id, struct.pack(">I", code)))
        self.cancelled(stream)
        self.maybe_close()

    def cancelled(self, stream: Stream) -> None:
        stream.done = True
        if stream.on_cancel is not None:
            stream.on_cancel(stream)

    def fail(self, code: int, message: str) -> None:
        """A connection error: GOAWAY, then close (what is owed is dropped)."""
        if self.lost or self.transport is None:
            return
        debug = message.encode("utf-8", "replace")[:256]
        self.write(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_id, code) + debug))
        self.flush()
        self.transport.close()
        self.lost = True
        streams, self.streams = list(self.streams.values()), {}
        for stream in streams:
            self.cancelled(stream)

    # -- the drain --------------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """GOAWAY in two steps (RFC 9113 6.8): first one that lets every stream through, and a
        PING; when its ACK is back, every stream the client sent before it has arrived, and the
        final GOAWAY names the last. Streams after it are not processed: clients retry them."""
        if self.draining or self.lost:
            return
        self.draining = True
        self.write(frame(GOAWAY, 0, 0, struct.pack(">II", MAX_WINDOW, NO_ERROR)))
        self.write(frame(PING, 0, 0, DRAIN_PING))

    def final_goaway(self) -> None:
        if self.goaway_at is not None or self.lost:
            return
        self.goaway_at = self.last_id
        self.write(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_id, NO_ERROR)))
        self.maybe_close()

    def maybe_close(self) -> None:
        if self.streams or self.lost or self.transport is None:
            return
        if self.goaway_at is not None or self.peer_gone:
            self.flush()
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self.lost:
            self.flush()
            self.transport.close()
