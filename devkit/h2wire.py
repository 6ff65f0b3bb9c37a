"""An in-process client of the gRPC port's HTTP/2 (service/protocols/rpc/http2/), for the unit
tests: a real Connection fed the bytes a client sends, its writes read back as frames (HPACK
decoded with the hpack package, as a client would), and a small echo port behind it (each
call's one message answered as is; "/slow" calls kept to answer later)."""

from __future__ import annotations

import asyncio
import struct

import hpack
from ringserve.service.protocols.rpc import http2 as h2

PATH = b"/inference.GRPCInferenceService/ModelInfer"


class Wire:
    """The transport: what the connection wrote, and whether it closed or paused."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class Echo:
    """h2.Port: every call's message answered as is; "/slow" calls are kept to answer later."""

    limit = 1 << 16
    max_streams = 100
    budget = 1 << 20
    stream_window = 65535  # as the gRPC port has it

    def __init__(self) -> None:
        self.kept: list[h2.Stream] = []
        self.cancelled: list[int] = []
        self.errors: list[Exception] = []
        self.seen: list[dict[str, str]] = []  # each call's metadata

    def opened(self, conn: h2.Connection) -> None: ...
    def closed(self, conn: h2.Connection) -> None: ...

    def broken(self, exc: Exception) -> None:
        self.errors.append(exc)

    def begin(self, stream: h2.Stream) -> None:
        self.seen.append(dict(stream.metadata))

        def keep(s: h2.Stream, data: bytes) -> None:
            s.request = data

        def end(s: h2.Stream) -> None:
            if s.path == b"/slow":
                self.kept.append(s)
            else:
                s.reply(s.request or b"")

        stream.on_message, stream.on_end = keep, end
        stream.on_cancel = lambda s: self.cancelled.append(s.id)


class Client:
    """A client's side: frames to send, and the server's frames read back."""

    def __init__(self, port: Echo | None = None, settings: bytes = b"") -> None:
        self.port = port or Echo()
        self.wire = Wire()
        self.conn = h2.Connection(self.port, lambda: 0)
        self.conn.connection_made(self.wire)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.pos = 0
        self.send(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, settings))

    def send(self, data: bytes) -> None:
        """Bytes as one read, then every loop turn the connection asks for (it reads at most
        FRAMES_PER_TURN frames a turn)."""
        self.conn.data_received(data)
        loop = asyncio.get_event_loop()
        while self.conn.backlog:
            loop.run_until_complete(asyncio.sleep(0))
        self.conn.sender.flush()

    def head(self, sid: int, path: bytes = PATH, flags: int = h2.END_HEADERS) -> bytes:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path.decode()),
                  (":authority", "t"), ("content-type", "application/grpc")]  # fmt: skip
        return h2.frame(h2.HEADERS, flags, sid, self.encoder.encode(fields))

    def call(self, sid: int, message: bytes, path: bytes = PATH, **extra: str) -> bytes:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path.decode()),
                  (":authority", "t"), ("content-type", "application/grpc"), ("te", "trailers"),
                  *extra.items()]  # fmt: skip
        return h2.frame(h2.HEADERS, h2.END_HEADERS, sid, self.encoder.encode(fields)) + h2.frame(
            h2.DATA, h2.END_STREAM, sid, struct.pack(">BI", 0, len(message)) + message
        )

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """The frames written since the last look: (type, flags, stream, payload)."""
        out, data = [], self.wire.data
        while len(data) - self.pos >= 9:
            n = int.from_bytes(data[self.pos : self.pos + 3])
            kind, flags = data[self.pos + 3], data[self.pos + 4]
            sid = int.from_bytes(data[self.pos + 5 : self.pos + 9])
            out.append((kind, flags, sid, bytes(data[self.pos + 9 : self.pos + 9 + n])))
            self.pos += 9 + n
        return out

    def answers(self) -> dict[int, list[tuple[str, object]]]:
        """Per stream: ("headers", {...}), ("data", bytes), ("rst", code) in order."""
        got: dict[int, list[tuple[str, object]]] = {}
        for kind, _flags, sid, payload in self.frames():
            if kind == h2.HEADERS:
                got.setdefault(sid, []).append(("headers", dict(self.decoder.decode(payload))))
            elif kind == h2.DATA:
                got.setdefault(sid, []).append(("data", payload))
            elif kind == h2.RST_STREAM:
                got.setdefault(sid, []).append(("rst", int.from_bytes(payload)))
        return got

    def goaway(self) -> tuple[int, int] | None:
        for kind, _flags, _sid, payload in self.frames():
            if kind == h2.GOAWAY:
                return struct.unpack(">II", payload[:8])
        return None
