"""What one gRPC connection may hold (issue 56), piece by piece, in process: the receive windows
refilled only as request bytes are consumed, the connection's budget of request bytes held and
of answers left unread, the open streams' header lists, the decoded-header cache in bytes, the
port's connection cap and the sweep's timeouts (rpc/limits.py), and a cancelled call's texts
dropped before a worker takes them (Admission.cancel). A real Connection is fed a client's
bytes, as in test_grpc_h2.py; tests/system/test_grpc_bounds.py runs the attacks on a server."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Iterator

import pytest
from ringserve.service.config.settings import Config
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.dispatcher import Dispatcher, Result
from ringserve.service.engine.requests import Ask, Group
from ringserve.service.protocols.rpc import http2 as h2
from ringserve.service.protocols.rpc.http2.codec import KEPT_BYTES, HeaderDecoder, kept_cost
from ringserve.service.protocols.rpc.limits import ConnectionLimits
from ringserve.shm import layout as L

from devkit.h2wire import Client, Echo, Wire

S = 1_000_000_000
BUDGET = 1 << 20  # the test port's budget: 1 MiB
LIMIT = 1 << 16  # its largest message
MESSAGE = 60000  # a message of the tests: within a stream's starting window, over 3 frames


@pytest.fixture(autouse=True)
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


class Streaming(Echo):
    """Echo, and "/stream": each request message answered by `answer` bytes, the call kept."""

    budget = BUDGET
    stream_window = 65535

    def __init__(self, answer: int = 50000) -> None:
        super().__init__()
        self.answer = answer

    def begin(self, stream: h2.Stream) -> None:
        super().begin(stream)
        if stream.path == b"/stream":
            stream.on_message = lambda s, data: s.send(bytes(self.answer))


def prefix(size: int) -> bytes:
    return struct.pack(">BI", 0, size)


def data(sid: int, payload: bytes, end: bool = False) -> bytes:
    """DATA frames of at most 16 KiB carrying `payload` (END_STREAM on the last with `end`)."""
    chunks = [payload[i : i + h2.FRAME_SIZE] for i in range(0, len(payload), h2.FRAME_SIZE)]
    last = len(chunks) - 1
    return b"".join(
        h2.frame(h2.DATA, h2.END_STREAM if end and i == last else 0, sid, chunk)
        for i, chunk in enumerate(chunks)
    )


def updates(frames: list[tuple[int, int, int, bytes]]) -> dict[int, int]:
    """The WINDOW_UPDATEs among frames: stream id -> the increments' sum."""
    got: dict[int, int] = {}
    for kind, _flags, sid, payload in frames:
        if kind == h2.WINDOW_UPDATE:
            got[sid] = got.get(sid, 0) + int.from_bytes(payload)
    return got


def status(answers: list[tuple[str, object]]) -> str:
    blocks = [v for k, v in answers if k == "headers" and isinstance(v, dict)]
    return str(blocks[-1].get("grpc-status")) if blocks else ""


# -- the windows ----------------------------------------------------------------------------------
def test_the_windows_refill_only_as_messages_are_consumed() -> None:
    """Parts of messages hold the window however far it falls (the old code gave it back at
    half); once the calls start with their messages, it comes back in full."""
    c = Client(Streaming())
    c.frames()
    part = prefix(MESSAGE) + bytes(MESSAGE - 1000)
    sids = range(1, 19, 2)  # 9 streams: 540 KB held, over half the window
    c.send(b"".join(c.head(sid, b"/slow") + data(sid, part) for sid in sids))
    assert updates(c.frames()) == {}
    assert c.conn.inflow.held == 9 * len(part) and c.conn.inflow.window == BUDGET - 9 * len(part)
    c.send(b"".join(data(sid, bytes(1000), end=True) for sid in sids))
    assert len(c.port.kept) == 9 and c.conn.inflow.held == 0
    given = updates(c.frames())  # the connection's, once a quarter of it is owed
    assert list(given) == [0] and given[0] + c.conn.inflow.credit == 9 * (MESSAGE + 5)
    assert c.conn.inflow.window + c.conn.inflow.credit == BUDGET


def test_a_streaming_call_gives_its_window_back_per_message_read() -> None:
    c = Client(Streaming(answer=1))
    c.frames()
    c.send(c.head(1, b"/stream"))
    message = prefix(20000) + bytes(20000)
    c.send(data(1, message))  # read and answered: consumed, but under a quarter of the window
    assert updates(c.frames()) == {} and c.conn.inflow.held == 0
    c.send(data(1, message))  # now over a quarter of the stream's window (not the connection's)
    assert updates(c.frames()) == {1: 2 * len(message)}


def test_the_stream_that_spends_the_window_on_parts_ends_resource_exhausted() -> None:
    """Parts of messages on many streams take the whole window: none can become whole, so the
    stream whose DATA spent it ends RESOURCE_EXHAUSTED, its bytes given back for the others."""
    c = Client(Streaming())
    c.frames()
    part = prefix(MESSAGE) + bytes(MESSAGE - 1000)
    n = BUDGET // len(part)
    c.send(b"".join(c.head(1 + 2 * i, b"/slow") + data(1 + 2 * i, part) for i in range(n)))
    rest = BUDGET - n * len(part)
    last = 1 + 2 * n
    c.send(c.head(last, b"/slow") + data(last, prefix(MESSAGE) + bytes(rest - 5)))
    frames = c.frames()
    assert updates(frames) == {0: rest}
    blocks = [p for k, _f, sid, p in frames if k == h2.HEADERS and sid == last]
    assert blocks and c.decoder.decode(blocks[-1])[-2:] == [
        ("grpc-status", "8"),
        ("grpc-message", "over the connection's bytes of requests held"),
    ]
    assert c.conn.inflow.held == n * len(part) <= BUDGET and not c.wire.closed
    c.send(data(1, bytes(1000), end=True))  # the others go on
    assert [s.id for s in c.port.kept] == [1]


def test_bytes_past_the_window_end_the_connection() -> None:
    c = Client(Streaming())
    c.frames()
    part = prefix(LIMIT) + bytes(LIMIT - 100)
    n = BUDGET // len(part)
    c.send(b"".join(c.head(1 + 2 * i, b"/slow") + data(1 + 2 * i, part) for i in range(n)))
    assert not c.wire.closed
    c.send(c.head(99, b"/slow") + data(99, bytes(BUDGET - n * len(part) + 1)))
    assert c.goaway() is not None and c.wire.closed


class Large(Streaming):
    limit = 1 << 18  # messages up to 256 KiB


def test_large_messages_sent_together_are_granted_their_windows_in_turn() -> None:
    """12 messages of 200 KB (2.4 MB, over the 1 MiB budget) sent at once, frame by frame in
    turns as nghttp2 sends them, by a client that keeps to its windows: each stream has 64 KiB
    to start, the rest granted as the budget leaves room, first come first served. All 12
    complete, none is refused, and the connection never holds over its budget."""
    c = Client(Large())
    c.frames()
    size = 200_000
    left = {1 + 2 * i: prefix(size) + bytes(size) for i in range(12)}
    windows = {sid: 65535 for sid in left}
    conn_window = BUDGET
    c.send(b"".join(c.head(sid, b"/slow") for sid in left))
    while left:
        sent = b""
        for sid in list(left):
            n = min(h2.FRAME_SIZE, len(left[sid]), windows[sid], conn_window)
            if n <= 0:
                continue
            chunk, left[sid] = left[sid][:n], left[sid][n:]
            windows[sid] -= n
            conn_window -= n
            end = h2.END_STREAM if not left[sid] else 0
            sent += h2.frame(h2.DATA, end, sid, chunk)
            if not left[sid]:
                del left[sid]
        assert sent, f"stalled: {({s: windows[s] for s in left}, conn_window)}"
        c.send(sent)
        assert c.conn.inflow.held <= BUDGET
        for kind, _flags, sid, payload in c.frames():
            assert kind != h2.HEADERS, "a call was answered (refused) before its message"
            if kind == h2.WINDOW_UPDATE and sid:
                windows[sid] += int.from_bytes(payload)
            elif kind == h2.WINDOW_UPDATE:
                conn_window += int.from_bytes(payload)
    assert sorted(s.id for s in c.port.kept) == [1 + 2 * i for i in range(12)]
    assert [len(s.request or b"") for s in c.port.kept] == [size] * 12
    assert c.conn.inflow.held == 0 and not c.conn.inflow.waiting


def test_a_finished_call_drops_the_rest_of_its_request() -> None:
    """A call answered before its request is whole (here: refused at its headers) holds none
    of what still comes."""
    c = Client(Streaming())
    c.frames()
    c.send(c.head(1, b"/slow"))
    stream = c.conn.table.streams[1]
    stream.finish(h2.UNAUTHENTICATED, "no")
    c.send(data(1, prefix(MESSAGE) + bytes(MESSAGE)))
    assert c.conn.inflow.held == 0


# -- unread answers -------------------------------------------------------------------------------
def test_answers_past_the_budget_end_the_call_resource_exhausted() -> None:
    """A client that sends requests and never opens its window for the answers: they wait, up
    to the budget; the answer past it ends the call, and what waited is dropped."""
    c = Client(Streaming(answer=50000))
    c.frames()
    c.send(c.head(1, b"/stream"))
    for _ in range(40):  # 2 MB of answers asked for
        c.send(data(1, prefix(10) + bytes(10)))
        assert c.conn.sender.unread <= BUDGET
    got = c.answers()[1]
    assert status(got) == "8" and c.conn.sender.unread == 0
    assert sum(len(v) for k, v in got if k == "data" and isinstance(v, bytes)) <= 65535
    assert not c.wire.closed
    c.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
    c.send(c.call(3, b"next"))  # the connection still serves
    assert status(c.answers()[3]) == "0"


def test_answers_the_transport_holds_count_once_the_client_stops_reading() -> None:
    c = Client(Streaming(answer=50000), settings=struct.pack(">HI", 4, 2**31 - 1))
    c.frames()
    c.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65535)))
    c.send(c.head(1, b"/stream"))
    c.wire.get_write_buffer_size = lambda: BUDGET  # type: ignore[method-assign]
    c.conn.pause_writing()
    c.send(data(1, prefix(10) + bytes(10)))
    assert status(c.answers()[1]) == "8"


# -- header lists, the decoded-header cache -------------------------------------------------------
def test_open_header_lists_past_the_budget_refuse_new_streams() -> None:
    port = Streaming()
    port.budget = 65536
    port.max_streams = 1000
    c = Client(port)
    c.frames()
    big = {"x-pad": "p" * 8000}
    c.send(c.head(1, b"/slow"))
    sids = list(range(3, 43, 2))
    for sid in sids:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", "/slow"),
                  (":authority", "t"), ("content-type", "application/grpc"),
                  *big.items()]  # fmt: skip
        c.send(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, c.encoder.encode(fields)))
    refused = [sid for sid, got in c.answers().items() if got == [("rst", h2.REFUSED_STREAM)]]
    assert refused and len(c.conn.table.streams) + len(refused) == 1 + len(sids)
    assert c.conn.inflow.heads <= port.budget


def test_the_decoded_header_cache_is_bounded_in_bytes() -> None:
    """Blocks of indexed fields only are kept decoded, at most KEPT_BYTES of them (as counted
    by kept_cost); a repeated block is still served from what was kept."""
    decoder = HeaderDecoder()
    rng = random.Random(5)
    first = bytes(0x80 | rng.randint(1, 61) for _ in range(40))
    assert decoder.decode(first) is decoder.decode(first)
    for _ in range(200):  # distinct blocks of 300 static-table fields each
        decoder.decode(bytes(0x80 | rng.randint(1, 61) for _ in range(300)))
    assert decoder.kept <= KEPT_BYTES
    assert decoder.kept == sum(kept_cost(b, f) for b, f in decoder.known.items())
    assert decoder.decode(first) is decoder.known[first]


# -- the connection cap and the sweep's timeouts --------------------------------------------------
class Capped(Streaming):
    """A port with the real ConnectionLimits."""

    def __init__(self, limits: ConnectionLimits) -> None:
        super().__init__()
        self.limits = limits

    def opened(self, conn: h2.Connection) -> None:
        self.limits.admit(conn, 0)

    def closed(self, conn: h2.Connection) -> None:
        self.limits.forget(conn)


LIMITS = Config(max_connections=2, read_timeout_s=1.0, grpc_idle_timeout_s=5.0, write_timeout_s=3.0)


def test_connections_over_the_cap_get_goaway_and_are_closed() -> None:
    limits = ConnectionLimits(LIMITS)
    clients = [Client(Capped(limits)) for _ in range(3)]
    assert [c.wire.closed for c in clients] == [False, False, True]
    assert clients[2].goaway() == (0, h2.NO_ERROR) and limits.refused == 1
    assert len(limits.connections) == 2


def test_an_idle_connection_gets_goaway_after_the_idle_timeout() -> None:
    limits = ConnectionLimits(LIMITS)
    c = Client(Capped(limits))
    c.frames()
    c.send(c.call(1, b"x"))
    limits.sweep(1 * S)
    c.frames()
    limits.sweep(5 * S)  # idle 4 s since the sweep saw its call
    assert not c.wire.closed
    limits.sweep(int(6.5 * S))
    assert c.goaway() == (1, h2.NO_ERROR) and c.wire.closed


def test_a_call_open_is_not_idle() -> None:
    limits = ConnectionLimits(LIMITS)
    c = Client(Capped(limits))
    c.send(c.call(1, b"x", path=b"/slow"))
    for t in range(1, 30):
        limits.sweep(t * S)
    assert not c.wire.closed


def test_no_preface_within_the_read_timeout_is_closed() -> None:
    limits = ConnectionLimits(LIMITS)
    c = Client.__new__(Client)
    c.port, c.wire, c.pos = Capped(limits), Wire(), 0
    c.conn = h2.Connection(c.port, lambda: 0)
    c.conn.connection_made(c.wire)
    c.conn.data_received(h2.PREFACE[:10])
    limits.sweep(S // 2)
    assert not c.wire.closed
    limits.sweep(int(1.5 * S))
    assert c.wire.closed


def test_a_client_leaving_our_writes_unread_is_dropped_after_the_write_timeout() -> None:
    limits = ConnectionLimits(LIMITS)
    c = Client(Capped(limits))
    c.send(c.call(1, b"x", path=b"/slow"))
    c.conn.pause_writing()
    limits.sweep(1 * S)
    limits.sweep(3 * S)
    assert not c.wire.closed
    limits.sweep(int(4.5 * S))
    assert c.wire.closed


def test_a_request_message_that_stops_coming_ends_deadline_exceeded() -> None:
    limits = ConnectionLimits(LIMITS)
    c = Client(Capped(limits))
    c.frames()
    c.send(c.head(1, b"/slow") + data(1, prefix(MESSAGE) + bytes(1000)))
    limits.sweep(1 * S)
    c.send(data(1, bytes(1000)))  # it moved: the clock starts again
    limits.sweep(int(1.8 * S))
    assert 1 in c.conn.table.streams
    limits.sweep(int(2.9 * S))
    c.conn.sender.flush()
    assert status(c.answers()[1]) == "4" and c.conn.inflow.held == 0


# -- a cancelled call's texts ---------------------------------------------------------------------
class Ring:
    """A worker whose request ring takes `room` texts (the dispatcher's WorkerLink, as routing
    reads it)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.models = frozenset({0})
        self.assigned: dict[int, object] = {}
        self.ring: list[int] = []

    def submit(self, messages: list[tuple[int, bytes, int, int]]) -> int:
        n = min(len(messages), self.room - len(self.ring))
        self.ring += [m[0] for m in messages[:n]]
        return n


def test_a_cancelled_group_drops_its_texts_no_worker_has_taken() -> None:
    d = Dispatcher(64, clock=lambda: 5 * S)
    worker = Ring(room=2)
    d.serving = [worker]  # type: ignore[list-item]
    a = Admission(d, lambda: d.why, 30.0)
    got: list[list[Result]] = []
    texts = [b"t%d" % i for i in range(6)]
    assert a.submit(Ask(texts, 0, "classify", 0, 10 * S), got.append, None) is None
    group = a.last_group
    assert isinstance(group, Group) and len(worker.ring) == 2 and len(d.waiting) == 4
    other: list[list[Result]] = []
    assert a.submit(Ask([b"other"], 0, "classify", 0, 10 * S), other.append, None) is None
    assert a.cancel(group) == 4
    assert [r.payload for r in d.waiting] == [b"other"] and not got
    assert d.depth == 3  # the two in the ring still run, and the other request waits
    for rid in worker.ring:  # the worker answers what it took
        d.answers.complete(d.inflight[rid], Result(L.STATUS_OK))
    (results,) = got
    assert [r.status for r in results] == [L.STATUS_OK] * 2 + [L.STATUS_CANCELLED] * 4
    assert a.cancel(group) == 0 and not other  # answered: nothing left to drop


def test_a_group_all_waiting_is_answered_at_once_when_cancelled() -> None:
    d = Dispatcher(64, clock=lambda: 5 * S)
    a = Admission(d, lambda: d.why, 30.0)  # no worker: every text waits
    got: list[list[Result]] = []
    assert a.submit(Ask([b"a", b"b"], 0, "classify", 0, 10 * S), got.append, None) is None
    assert a.last_group is not None and a.cancel(a.last_group) == 2
    assert [[r.status for r in rs] for rs in got] == [[L.STATUS_CANCELLED] * 2]
    assert d.depth == 0 and not d.waiting
