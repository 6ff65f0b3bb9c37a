"""rpc/http2/, gRPC's HTTP/2 on the loop: a real Connection fed the bytes a client sends, its
writes read back as frames (HPACK decoded with the hpack package, as a client would). The port
behind it is a small echo: each call's one message answered as is (devkit/h2wire.py)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import hpack
import pytest
from ringserve.service.protocols.rpc import http2 as h2

from devkit.h2wire import PATH, Client, Echo, Wire


@pytest.fixture(autouse=True)
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def test_a_unary_call_is_headers_data_and_trailers() -> None:
    c = Client()
    c.frames()  # our SETTINGS and window, their ACK
    c.send(c.call(1, b"hello") + c.call(3, b""))
    got = c.answers()
    for sid, body in ((1, b"hello"), (3, b"")):
        (_, head), (_, data), (_, trailers) = got[sid]
        assert head == {":status": "200", "content-type": "application/grpc"}
        assert data == struct.pack(">BI", 0, len(body)) + body
        assert trailers == {"grpc-status": "0"}
    assert not c.conn.table.streams and not c.wire.closed


def test_errors_are_trailers_only_with_the_message_percent_encoded() -> None:
    c = Client()
    c.frames()
    c.send(c.call(1, b"x", path=b"/slow"))
    (stream,) = c.port.kept
    stream.finish(h2.NOT_FOUND, "unknown model: caf\u00e9 100%", (("retry-after", "1"),))
    c.conn.sender.flush()
    ((_, block),) = c.answers()[1]
    assert block == {":status": "200", "content-type": "application/grpc", "grpc-status": "5",
                     "grpc-message": "unknown model: caf%C3%A9 100%25",
                     "retry-after": "1"}  # fmt: skip


def test_indexed_blocks_decode_the_same_when_the_table_moves() -> None:
    """Blocks of indexed fields only are kept decoded; a block that changes the dynamic table
    empties what was kept, so the same bytes later name the new entries."""
    c = Client()
    for i in range(6):  # each value twice: a new one moves the table
        c.send(c.call(1 + 2 * i, b"m", **{"x-call": str(i // 2)}))
    assert [m["x-call"] for m in c.port.seen] == ["0", "0", "1", "1", "2", "2"]
    assert len(c.answers()) == 6
    assert c.conn.decoder.known  # the last repeat was served from what was kept


def test_repeated_header_blocks_name_their_own_paths() -> None:
    """Two header lists, each repeated (indexed-only blocks, kept decoded), in turns: each call
    is read with its own list's path, not the last one read (StreamTable keeps the call
    headers of the last list beside it)."""
    c = Client()
    paths = [PATH, PATH, b"/slow", b"/slow", PATH, b"/slow", PATH]
    c.send(b"".join(c.call(1 + 2 * i, b"m", path=p) for i, p in enumerate(paths)))
    assert [s.id for s in c.port.kept] == [1 + 2 * i for i, p in enumerate(paths) if p != PATH]
    assert sorted(c.answers()) == [1 + 2 * i for i, p in enumerate(paths) if p == PATH]
    assert len(c.conn.decoder.known) == 2  # both lists were served from what was kept


def test_the_answer_waits_for_the_clients_window() -> None:
    c = Client(settings=struct.pack(">HI", 4, 10))  # SETTINGS_INITIAL_WINDOW_SIZE 10
    c.frames()
    c.send(c.call(1, b"0123456789abcdef"))
    got = c.answers()[1]
    assert got[1] == ("data", struct.pack(">BI", 0, 16) + b"01234")
    c.send(h2.frame(h2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 100)))
    got = c.answers()[1]
    assert [k for k, _ in got] == ["data", "headers"]
    assert got[0][1] == b"56789abcdef" and got[1][1] == {"grpc-status": "0"}


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", h2.PROTOCOL_ERROR),
        (h2.frame(h2.DATA, 0, 0, b"x"), h2.PROTOCOL_ERROR),  # DATA on stream 0
        (h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff"), h2.COMPRESSION_ERROR),
        (h2.frame(h2.HEADERS, 0, 1, b"") + h2.frame(h2.PING, 0, 0, bytes(8)), h2.PROTOCOL_ERROR),
        (struct.pack(">I", 20000)[1:] + bytes(6), h2.FRAME_SIZE_ERROR),
        (h2.frame(h2.SETTINGS, 0, 0, b"\x00\x04\xff\xff\xff\xff"), h2.FLOW_CONTROL_ERROR),
        (h2.frame(h2.WINDOW_UPDATE, 0, 0, bytes(4)), h2.PROTOCOL_ERROR),
        (h2.frame(h2.PUSH_PROMISE, 4, 1, bytes(8)), h2.PROTOCOL_ERROR),
    ],
)
def test_a_broken_connection_ends_with_goaway(data: bytes, code: int) -> None:
    c = Client()
    c.frames()
    if data.startswith(b"GET"):
        c = Client.__new__(Client)
        c.port, c.wire, c.pos = Echo(), Wire(), 0
        c.conn = h2.Connection(c.port, lambda: 0)
        c.conn.connection_made(c.wire)
    c.send(data)
    assert c.goaway() == (0, code) and c.wire.closed and not c.port.errors


def test_unknown_frames_and_priority_are_ignored() -> None:
    c = Client()
    c.frames()
    c.send(h2.frame(0x42, 0xFF, 7, b"whatever") + h2.frame(h2.PRIORITY, 0, 1, bytes(5)))
    c.send(c.call(1, b"ok"))
    assert len(c.answers()[1]) == 3 and not c.wire.closed


def test_ping_is_answered_and_settings_acknowledged() -> None:
    c = Client()
    kinds = [(k, f) for k, f, _, _ in c.frames()]
    assert (h2.SETTINGS, 0) in kinds and (h2.SETTINGS, h2.ACK) in kinds
    c.send(h2.frame(h2.PING, 0, 0, b"12345678"))
    assert c.frames() == [(h2.PING, h2.ACK, 0, b"12345678")]


def test_the_drain_lets_calls_in_flight_finish_and_refuses_later_ones() -> None:
    c = Client()
    c.frames()
    c.send(c.call(1, b"x", path=b"/slow"))
    c.conn.begin_drain()
    c.conn.sender.flush()
    frames = c.frames()
    assert frames[0][0] == h2.GOAWAY and struct.unpack(">II", frames[0][3]) == (2**31 - 1, 0)
    assert frames[1][:3] == (h2.PING, 0, 0)
    c.send(c.call(3, b"before the ack", path=b"/slow"))  # sent before the client heard it
    c.send(h2.frame(h2.PING, h2.ACK, 0, frames[1][3]))
    assert c.goaway() == (3, h2.NO_ERROR)
    c.send(c.call(5, b"after"))  # after the final GOAWAY: not processed
    assert len(c.port.kept) == 2 and 5 not in c.answers()
    for stream in c.port.kept:
        assert not c.wire.closed
        stream.reply(b"late")
        c.conn.sender.flush()
    assert c.wire.closed


def test_streams_over_the_limit_are_refused() -> None:
    port = Echo()
    port.max_streams = 1
    c = Client(port)
    c.frames()
    c.send(c.call(1, b"x", path=b"/slow") + c.call(3, b"y"))
    assert c.answers() == {3: [("rst", h2.REFUSED_STREAM)]}


def test_a_flood_of_reset_calls_ends_the_connection() -> None:
    c = Client()
    c.frames()
    for sid in range(1, 2 * (h2.WASTE_BURST + 2), 2):
        c.send(c.call(sid, b"x", path=b"/slow")
               + h2.frame(h2.RST_STREAM, 0, sid, struct.pack(">I", h2.CANCEL)))  # fmt: skip
        if c.wire.closed:
            break
    assert c.wire.closed and c.goaway() == (sid, 11)  # ENHANCE_YOUR_CALM


def test_a_message_over_the_limit_ends_its_call() -> None:
    c = Client()
    c.frames()
    big = struct.pack(">BI", 0, 1 << 20)
    head = c.call(1, b"")[: -5 - 9]  # the HEADERS frame alone
    c.send(head + h2.frame(h2.DATA, 0, 1, big))
    ((_, block), (_, code)) = c.answers()[1]
    assert block == {":status": "200", "content-type": "application/grpc",
                     "grpc-status": str(h2.RESOURCE_EXHAUSTED),
                     "grpc-message": f"request message over {1 << 16} bytes"}  # fmt: skip
    assert code == h2.NO_ERROR


def test_grpc_timeout_and_its_units() -> None:
    assert h2.parse_timeout(b"1500m") == 1_500_000_000
    assert h2.parse_timeout(b"2S") == 2 * 10**9 and h2.parse_timeout(b"7n") == 7
    for bad in (b"", b"m", b"123456789m", b"12x", b"-1S", b"1.5S"):
        assert h2.parse_timeout(bad) is None


# -- the budget of frames that do no useful work (issue 46: no connection stalls the server) ---
def calm(c: Client, message: bytes) -> None:
    goaway = [p for k, _, _, p in c.frames() if k == h2.GOAWAY]
    assert goaway and struct.unpack(">II", goaway[0][:8])[1] == h2.ENHANCE_YOUR_CALM, goaway
    assert message in goaway[0][8:] and c.wire.closed and not c.port.errors


def test_empty_continuations_after_headers_end_the_connection() -> None:
    """CVE-2024-27316's family: a header block that never ends, in empty CONTINUATIONs."""
    c = Client()
    c.frames()
    c.send(c.head(1, flags=0) + h2.frame(h2.CONTINUATION, 0, 1) * (h2.MAX_CONTINUATIONS + 1))
    calm(c, b"CONTINUATION")


@pytest.mark.parametrize(
    ("flood", "message"),
    [
        (h2.frame(0x42, 0, 0), b"unknown types"),
        (h2.frame(h2.PING, 0, 0, bytes(8)), b"PING"),
        (h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", 4, 1000)), b"SETTINGS"),
        (h2.frame(h2.PRIORITY, 0, 1, bytes(5)), b"PRIORITY"),
    ],
)
def test_a_flood_of_frames_that_do_nothing_is_calmed(flood: bytes, message: bytes) -> None:
    c = Client()
    c.frames()
    c.send(flood * (h2.WASTE_BURST + 1))
    calm(c, message)


def test_rapid_reset_of_calls_that_carried_their_body_is_calmed() -> None:
    """Each call is whole (HEADERS, DATA with END_STREAM) and answered before its reset: the
    resets still count, however the streams ended."""
    c = Client()
    c.frames()
    resets = b"".join(
        c.call(sid, b"x") + h2.frame(h2.RST_STREAM, 0, sid, struct.pack(">I", h2.CANCEL))
        for sid in range(1, 2 * h2.WASTE_BURST + 4, 2)
    )
    c.send(resets)
    calm(c, b"streams reset")


def test_resets_of_calls_still_running_cost_more() -> None:
    c = Client()
    c.frames()
    reset = struct.pack(">I", h2.CANCEL)
    n = h2.WASTE_BURST // h2.RESET_IN_FLIGHT + 1
    for sid in range(1, 2 * n, 2):  # each reset in a read after its call's
        c.send(c.call(sid, b"x", path=b"/slow"))
        c.send(h2.frame(h2.RST_STREAM, 0, sid, reset))
        if c.wire.closed:
            break
    calm(c, b"streams reset")
    assert len(c.port.kept) == n - 1  # the first SETTINGS took one from the budget too


def test_a_call_reset_in_the_read_that_ended_it_never_starts() -> None:
    c = Client()
    c.frames()
    reset = h2.frame(h2.RST_STREAM, 0, 1, struct.pack(">I", h2.CANCEL))
    c.send(c.call(1, b"x", path=b"/slow") + reset + c.call(3, b"y", path=b"/slow"))
    assert [s.id for s in c.port.kept] == [3] and c.port.cancelled == [1]


def test_a_client_that_wastes_slowly_is_never_closed() -> None:
    """PINGs, SETTINGS and cancels at a grpc client's pace (here 50 a second for 100 s of the
    connection's clock, half the refill) never end it."""
    clock = [0]
    c = Client.__new__(Client)
    c.port, c.wire, c.pos = Echo(), Wire(), 0
    c.encoder, c.decoder = hpack.Encoder(), hpack.Decoder()
    c.conn = h2.Connection(c.port, lambda: clock[0])
    c.conn.connection_made(c.wire)
    c.send(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
    for i in range(5000):
        clock[0] += 20_000_000
        c.send(h2.frame(h2.PING, 0, 0, bytes(8)) if i % 2 else h2.frame(h2.SETTINGS, 0, 0))
    c.send(c.call(1, b"still here"))
    assert not c.wire.closed and len(c.answers()[1]) == 3


def test_one_read_does_bounded_work() -> None:
    """More frames than one turn reads: the socket is not read again until the rest is done,
    and the loop serves others in between."""
    c = Client()
    c.frames()
    c.conn.data_received(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * 600)
    assert c.conn.backlog and c.wire.paused and len(c.conn.buf) == 13 * (600 - h2.FRAMES_PER_TURN)
    c.send(b"")
    assert not c.conn.backlog and not c.wire.paused and not c.conn.buf and not c.wire.closed


# -- RFC 9113 errors h2spec checks -------------------------------------------------------------
def test_headers_on_a_lower_stream_id_is_a_protocol_error() -> None:
    c = Client()
    c.frames()
    c.send(c.call(5, b"x") + c.call(3, b"y"))
    assert c.goaway() == (5, h2.PROTOCOL_ERROR) and c.wire.closed


def test_data_on_a_stream_the_client_ended_is_stream_closed() -> None:
    c = Client()
    c.frames()
    c.send(c.call(1, b"x"))
    assert len(c.answers()[1]) == 3  # answered, both sides ended
    c.send(h2.frame(h2.DATA, 0, 1, b"late"))
    assert c.goaway() == (1, h2.STREAM_CLOSED) and c.wire.closed


def test_data_in_flight_on_a_stream_we_ended_is_ignored() -> None:
    port = Echo()
    port.max_streams = 1
    c = Client(port)
    c.frames()
    c.send(c.call(1, b"x", path=b"/slow") + c.head(3))  # 3 is refused
    c.send(h2.frame(h2.DATA, h2.END_STREAM, 3, struct.pack(">BI", 0, 0)))
    assert c.answers() == {3: [("rst", h2.REFUSED_STREAM)]} and not c.wire.closed


def test_data_on_a_half_closed_stream_resets_it() -> None:
    c = Client()
    c.frames()
    c.send(c.call(1, b"x", path=b"/slow"))
    c.send(h2.frame(h2.DATA, 0, 1, struct.pack(">BI", 0, 0)))
    assert c.answers() == {1: [("rst", h2.STREAM_CLOSED)]} and not c.wire.closed


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (h2.frame(h2.HEADERS, h2.END_HEADERS, 2, b""), h2.PROTOCOL_ERROR),  # an even id
        (h2.frame(h2.RST_STREAM, 0, 0, bytes(4)), h2.PROTOCOL_ERROR),  # stream 0
        (h2.frame(h2.PING, 0, 1, bytes(8)), h2.PROTOCOL_ERROR),  # PING on a stream
        (h2.frame(h2.DATA, 0, 9, b"x"), h2.PROTOCOL_ERROR),  # an idle stream
        (h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)), h2.FLOW_CONTROL_ERROR),
        (h2.frame(h2.SETTINGS, 0, 0, b"\x00\x05\x00\x00\x00\x01"), h2.PROTOCOL_ERROR),
        (h2.frame(h2.PING, 0, 0, bytes(7)), h2.FRAME_SIZE_ERROR),
    ],
)
def test_rfc_9113_connection_errors(data: bytes, code: int) -> None:
    c = Client()
    c.frames()
    c.send(data)
    assert c.goaway() == (0, code) and c.wire.closed and not c.port.errors
