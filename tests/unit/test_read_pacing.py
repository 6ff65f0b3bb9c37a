"""When each kind of connection stops reading its socket, and when it reads again (issue 57,
item 3): answers owed past the pipeline's bound, a client that does not read ours, a read past
the turn's quota, the drain, an EOF, a lost connection. Written against the four protocols
before their gating moved into one object, so that the move changes none of it. The production
protocol objects on fake transports (devkit.fakes, devkit.h2wire); no process, no socket."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from ringserve.service.config.settings import Config
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.models.modelset import ModelSet
from ringserve.service.protocols.binary import FRAMES_PER_TURN, BinaryProtocol, BinaryServerState
from ringserve.service.protocols.control import ControlProtocol
from ringserve.service.protocols.http import MAX_PIPELINE, Exchange, HttpProtocol, HttpServerState
from ringserve.service.protocols.rpc import http2 as h2
from ringserve.wire.frames import AnswerParser, encode_frame

from devkit.fakes import Clock, RingWorker, Transport
from devkit.h2wire import Client as H2Client


class Counting(Transport):
    """A fake transport that also counts what it was told about reading."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses = self.resumes = 0

    def pause_reading(self) -> None:
        self.pauses += 1
        super().pause_reading()

    def resume_reading(self) -> None:
        self.resumes += 1
        super().resume_reading()

    def is_closing(self) -> bool:
        return self.closed


def turns(test: Callable[[], Any], n: int = 50) -> Any:
    """Run `test` as a loop's first callback, then `n` more turns of that loop."""

    async def main() -> Any:
        result = test()
        for _ in range(n):
            await asyncio.sleep(0)
        return result

    return asyncio.run(main())


# -- HTTP/1.1 -------------------------------------------------------------------------------------
def held_http() -> tuple[HttpProtocol, Counting, list[Exchange]]:
    """A connection whose requests are answered when the test says."""
    owed: list[Exchange] = []
    state = HttpServerState(Config(), lambda c, ex: owed.append(ex), lambda *_: None, Clock())
    conn, transport = HttpProtocol(state), Counting()
    conn.connection_made(transport)
    return conn, transport, owed


LONG = b"/" + b"a" * 20  # 47 bytes a request: a slice holds more than a turn frames


def requests(n: int, path: bytes = b"/a") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: h\r\n\r\n" % path * n


def test_http_answers_owed_past_the_pipeline_pause_reading_until_one_is_written() -> None:
    conn, transport, owed = held_http()
    conn.data_received(requests(MAX_PIPELINE - 1))
    assert transport.reading and transport.pauses == 0
    conn.data_received(requests(2))  # read in the same read as the one that filled it: framed
    assert not transport.reading and transport.pauses == 1 and len(owed) == MAX_PIPELINE + 1
    conn.respond(owed[0], 200, b"{}")
    assert not transport.reading  # still MAX_PIPELINE owed
    conn.respond(owed[1], 200, b"{}")
    assert transport.reading and transport.resumes == 1


def test_http_a_client_that_does_not_read_stops_reading_until_it_does() -> None:
    conn, transport, owed = held_http()
    conn.pause_writing()
    conn.pause_writing()  # told twice: one pause
    assert not transport.reading and transport.pauses == 1
    conn.data_received(requests(1))  # what was read before the pause is still framed
    assert len(owed) == 1
    conn.resume_writing()
    assert transport.reading and transport.resumes == 1


def test_http_reading_resumes_only_when_no_reason_is_left() -> None:
    conn, transport, owed = held_http()
    conn.data_received(requests(MAX_PIPELINE))
    conn.pause_writing()
    assert transport.pauses == 1
    for ex in owed:  # written into the transport's buffer: the pipeline is empty
        conn.respond(ex, 200, b"{}")
    assert not transport.reading  # the client still reads nothing
    conn.resume_writing()
    assert transport.reading and transport.resumes == 1
    owed.clear()
    conn.pause_writing()
    conn.data_received(requests(MAX_PIPELINE))
    conn.resume_writing()
    assert not transport.reading  # answers still owed
    conn.respond(owed[0], 200, b"{}")
    assert transport.reading and (transport.pauses, transport.resumes) == (2, 2)


def test_http_a_write_blocked_backlog_is_framed_and_reading_stays_paused() -> None:
    conn, transport, owed = held_http()
    seen: list[Any] = []

    def first_turn() -> None:
        conn.pause_writing()
        conn.data_received(requests(60, LONG))  # over a slice: the rest waits for a turn
        seen.extend([bool(conn.backlog), len(owed)])

    turns(first_turn)
    assert seen[0] and seen[1] < 60
    assert len(owed) == 60 and not conn.backlog and not transport.reading
    conn.resume_writing()
    assert transport.reading and transport.pauses == 1


def test_http_a_backlog_is_framed_at_the_next_turn_and_reading_resumes() -> None:
    conn, transport, owed = held_http()
    seen: list[Any] = []

    def first_turn() -> None:
        conn.data_received(requests(60, LONG))
        seen.extend([bool(conn.backlog), transport.reading, len(owed)])

    turns(first_turn)
    assert seen[:2] == [True, False] and seen[2] < 60
    assert len(owed) == 60 and transport.reading and (transport.pauses, transport.resumes) == (1, 1)


def test_http_the_drain_stops_reading_between_requests_for_good() -> None:
    conn, transport, owed = held_http()
    conn.data_received(requests(2))
    conn.state.begin_drain()
    assert not transport.reading and transport.pauses == 1 and not transport.closed
    conn.respond(owed[0], 200, b"{}")
    assert not transport.reading and not transport.closed
    conn.respond(owed[1], 200, b"{}")
    assert transport.closed and transport.resumes == 0
    assert transport.written.lower().count(b"connection: close") == 1


def test_http_the_drain_reads_a_request_begun_to_its_end_then_stops() -> None:
    conn, transport, owed = held_http()
    conn.data_received(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\n{}")
    conn.state.begin_drain()
    assert transport.reading and not owed  # its body is still to come
    conn.data_received(b"{}")
    assert len(owed) == 1 and not transport.reading
    conn.respond(owed[0], 200, b"{}")
    assert transport.closed and transport.resumes == 0


def test_http_a_request_that_cannot_be_framed_stops_reading() -> None:
    conn, transport, owed = held_http()
    conn.data_received(requests(1) + b"NOT HTTP\r\n\r\n")
    assert not transport.reading and not transport.closed  # the first is still owed
    conn.respond(owed[0], 200, b"{}")
    assert transport.closed and transport.resumes == 0
    assert transport.written.count(b"HTTP/1.1 400 ") == 1


def test_http_after_an_eof_reading_is_never_touched_again() -> None:
    conn, transport, owed = held_http()
    conn.data_received(requests(MAX_PIPELINE))
    assert transport.pauses == 1
    assert conn.eof_received() is True  # a half-close: its answers still go out
    conn.pause_writing()
    conn.resume_writing()
    for ex in owed:
        conn.respond(ex, 200, b"{}")
    assert (transport.pauses, transport.resumes) == (1, 0) and transport.closed


def test_http_a_lost_connection_touches_reading_no_more() -> None:
    conn, transport, _ = held_http()
    conn.data_received(requests(MAX_PIPELINE))
    conn.connection_lost(None)
    conn.resume_writing()
    conn.pause_writing()
    assert (transport.pauses, transport.resumes) == (1, 0)


# -- binary frames --------------------------------------------------------------------------------
def frames(tags: range) -> bytes:
    return b"".join(encode_frame("ok", tag) for tag in tags)


class Engine:
    """The production dispatcher and admission, before a stand-in worker that answers what
    its ring holds when the test says."""

    def __init__(self, room: int = 4096) -> None:
        self.dispatcher = Dispatcher(8192, Clock(), max_queue_ms=1000.0)
        self.worker = RingWorker(room=room)
        self.dispatcher.serving = [self.worker]
        self.admission = Admission(self.dispatcher, lambda: self.dispatcher.why, 30.0)

    @property
    def depth(self) -> int:
        return self.dispatcher.depth

    def answer(self) -> None:
        for _ in range(100):
            if not self.dispatcher.depth:
                return
            self.worker.answer()
            self.dispatcher.answers.read(self.worker)


def counted_binary() -> tuple[BinaryProtocol, Counting, Engine]:
    """A binary connection whose frames the engine answers when told."""
    engine = Engine()
    manifest = SimpleNamespace(
        embed_only=False, normalize=False, token_classifies=False, task=["classify"]
    )
    model = SimpleNamespace(name="m", version=1, index=0, manifest=manifest)
    host = SimpleNamespace(settings=Config(), draining=False, keys=None, models=ModelSet(model),
                           admission=engine.admission, count=lambda *_: None)  # fmt: skip
    conn, transport = BinaryProtocol(BinaryServerState(host)), Counting()
    conn.connection_made(transport)
    return conn, transport, engine


def test_binary_a_client_that_does_not_read_stops_reading_until_it_does() -> None:
    conn, transport, engine = counted_binary()
    conn.pause_writing()
    conn.pause_writing()
    assert not transport.reading and transport.pauses == 1
    conn.data_received(frames(range(1, 4)))  # read before the pause: still admitted
    engine.answer()
    assert not transport.reading and len(AnswerParser().feed(transport.written)) == 3
    conn.resume_writing()
    assert transport.reading and transport.resumes == 1


def test_binary_a_write_blocked_backlog_is_parsed_and_reading_stays_paused() -> None:
    conn, transport, engine = counted_binary()
    seen: list[Any] = []

    def first_turn() -> None:
        conn.pause_writing()
        conn.data_received(frames(range(1, 3001)))
        seen.append(engine.depth)

    turns(first_turn)
    assert seen == [FRAMES_PER_TURN] and engine.depth == 3000
    assert not transport.reading and transport.pauses == 1
    conn.resume_writing()
    assert transport.reading and transport.resumes == 1


def test_binary_a_stopped_connection_reads_and_drops_even_while_write_blocked() -> None:
    """After an oversize length it reads on and drops what comes: closing on unread input
    would send a reset that can erase answers the client has not read yet."""
    conn, transport, engine = counted_binary()
    conn.data_received(frames(range(1, 3)))
    conn.pause_writing()
    assert not transport.reading
    conn.data_received(struct.pack("<I", 1 << 30))
    assert transport.reading and not transport.closed  # two answers still owed
    conn.data_received(frames(range(3, 5)))  # dropped
    engine.answer()
    assert transport.closed and len(AnswerParser().feed(transport.written)) == 2


def test_binary_the_drain_parses_a_backlog_at_once() -> None:
    conn, transport, engine = counted_binary()
    seen: list[Any] = []

    def first_turn() -> None:
        conn.data_received(frames(range(1, 3001)))
        conn.end.drain()
        seen.append(engine.depth)

    turns(first_turn)
    assert seen[0] == 2 * FRAMES_PER_TURN  # the turn it waited for, at once; the rest at theirs
    assert engine.depth == 3000 and transport.reading and not transport.closed
    engine.answer()
    assert transport.closed and len(AnswerParser().feed(transport.written)) == 3000


def test_binary_after_an_eof_reading_is_never_touched_again() -> None:
    conn, transport, engine = counted_binary()
    conn.data_received(frames(range(1, 3)))
    assert conn.eof_received() is True  # answers owed: the write side stays open
    conn.pause_writing()
    conn.resume_writing()
    engine.answer()
    assert (transport.pauses, transport.resumes) == (0, 0) and transport.closed


# -- HTTP/2 ---------------------------------------------------------------------------------------
@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The loop the HTTP/2 connection is made on (it asks for the current one)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def window_updates(n: int) -> bytes:
    return h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * n


@pytest.mark.usefixtures("loop")
def test_h2_a_client_that_does_not_read_stops_reading_until_it_does() -> None:
    c = H2Client()
    c.conn.pause_writing()
    assert c.wire.paused and not c.conn.reading
    c.send(c.call(1, b"read before the pause"))
    assert c.wire.paused
    c.conn.resume_writing()
    assert not c.wire.paused and c.conn.reading and len(c.answers()[1]) == 3


@pytest.mark.usefixtures("loop")
def test_h2_a_write_blocked_backlog_is_read_and_reading_stays_paused() -> None:
    c = H2Client()
    c.conn.pause_writing()
    c.send(window_updates(600))  # more than a turn reads: the turns it asks for run
    assert not c.conn.backlog and not c.conn.buf and c.wire.paused
    c.conn.resume_writing()
    assert not c.wire.paused and not c.wire.closed


@pytest.mark.usefixtures("loop")
def test_h2_a_failed_connection_touches_reading_no_more() -> None:
    c = H2Client()
    resumed: list[bool] = []
    c.wire.resume_reading = lambda: resumed.append(True)
    c.conn.data_received(h2.frame(h2.PUSH_PROMISE, 0, 1, bytes(4)))
    assert c.wire.closed and c.conn.lost
    c.conn.pause_writing()
    c.conn.resume_writing()
    assert not resumed


# -- the control socket ---------------------------------------------------------------------------
class SlowAdmin:
    """A reload that waits for the test; status at once."""

    def __init__(self) -> None:
        self.reloaded: asyncio.Future[str | None] | None = None

    def status(self) -> dict[str, Any]:
        return {"workers": 1}

    def generation(self) -> int:
        return 2

    def reload(self, reason: str) -> Awaitable[str | None]:
        self.reloaded = asyncio.get_running_loop().create_future()
        return self.reloaded


def control() -> tuple[ControlProtocol, Counting, SlowAdmin, list[int]]:
    admin, codes = SlowAdmin(), []
    conn = ControlProtocol(admin, None, lambda _p, code: codes.append(code), 1 << 16)
    transport = Counting()
    conn.connection_made(transport)
    return conn, transport, admin, codes


def replies(transport: Transport) -> list[bytes]:
    return transport.written.splitlines()


def test_control_a_command_working_off_the_loop_holds_reading_and_the_lines_after_it() -> None:
    async def run() -> tuple[list[Any], Counting]:
        conn, transport, admin, _ = control()
        conn.data_received(b'{"cmd": "reload"}\n{"cmd": "status"}\n')
        await asyncio.sleep(0)
        seen: list[Any] = [transport.reading, replies(transport)]
        assert admin.reloaded is not None
        admin.reloaded.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        seen.extend([transport.reading, replies(transport)])
        return seen, transport

    seen, transport = asyncio.run(run())
    assert seen[:2] == [False, []]
    assert seen[2] is True and [b'"generation": 2' in r for r in seen[3]] == [True, False]
    assert b'"workers": 1' in seen[3][1] and (transport.pauses, transport.resumes) == (1, 1)


def test_control_a_connection_lost_while_a_command_works_is_not_read_again() -> None:
    async def run() -> Counting:
        conn, transport, admin, _ = control()
        conn.data_received(b'{"cmd": "reload"}\n')
        await asyncio.sleep(0)
        conn.connection_lost(None)
        assert admin.reloaded is not None
        admin.reloaded.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        return transport

    transport = asyncio.run(run())
    assert (transport.pauses, transport.resumes) == (1, 0) and transport.written == b""
