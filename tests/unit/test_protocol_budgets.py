"""HTTP/1.1 and binary frames, fed what a hostile client sends (issue 46: no connection stalls
the server): one read does bounded work before the loop serves others, a chunked body of tiny
chunks and a run of empty lines are refused, and a flood of bad frames ends its connection. The
production protocol objects on a fake transport (devkit.fakes), inside a real event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
from ringserve.service.config.settings import Config
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.dispatcher import Result
from ringserve.service.models.modelset import ModelSet
from ringserve.service.protocols import http as http_module
from ringserve.service.protocols.binary import (
    FRAMES_PER_TURN,
    GARBAGE_BURST,
    GARBAGE_RATE,
    BinaryProtocol,
    BinaryServerState,
)
from ringserve.service.protocols.http import Exchange, HttpProtocol, HttpServerState
from ringserve.shm import layout as L
from ringserve.wire.frames import AnswerParser, encode_frame

from devkit.fakes import Transport


def in_loop(test: Callable[[], Any]) -> Any:
    """Run `test` as the loop's first callback, then every turn it asked for."""

    async def main() -> Any:
        result = test()
        for _ in range(200):
            await asyncio.sleep(0)
        return result

    return asyncio.run(main())


def http_conn() -> tuple[HttpProtocol, Transport, list[bytes]]:
    routed: list[bytes] = []

    def route(conn: HttpProtocol, ex: Exchange) -> None:
        routed.append(ex.url)
        conn.respond(ex, 404, b"{}")

    conn, transport = HttpProtocol(HttpServerState(Config(), route, lambda *_: None)), Transport()
    conn.connection_made(transport)
    return conn, transport, routed


def test_pipelined_junk_is_framed_a_few_requests_a_turn() -> None:
    conn, transport, routed = http_conn()
    seen: list[int] = []
    request = b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"

    def first_turn() -> None:
        conn.data_received(request * 200)
        seen.append(len(routed))
        seen.append(transport.reading)

    in_loop(first_turn)
    most = http_module.REQUESTS_PER_TURN + http_module.SLICE // len(request)
    assert http_module.REQUESTS_PER_TURN <= seen[0] <= most and seen[1] is False
    assert len(routed) == 200 and transport.reading and not transport.closed
    assert transport.written.count(b"HTTP/1.1 404") == 200


def test_a_body_of_tiny_chunks_is_refused() -> None:
    conn, transport, routed = http_conn()
    chunks = b"1\r\nx\r\n" * (http_module.BODY_PIECES * 2) + b"0\r\n\r\n"
    head = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    reads = [head] + [chunks[i : i + 600] for i in range(0, len(chunks), 600)]
    in_loop(lambda: [conn.data_received(data) for data in reads])
    assert not routed and transport.closed
    assert transport.written.startswith(b"HTTP/1.1 400") and b"pieces" in transport.written


def test_a_run_of_empty_lines_is_refused() -> None:
    conn, transport, routed = http_conn()
    blank = b"\r\n" * (Config().max_head + 40000)
    in_loop(lambda: [conn.data_received(blank[i : i + 65536]) for i in range(0, len(blank), 65536)])
    assert not routed and transport.closed and transport.written.startswith(b"HTTP/1.1 4")


class Dispatcher:
    """Takes every frame admitted, and answers them when the test says (as workers would)."""

    max_tokens = 512

    def __init__(self) -> None:
        self.owed: list[tuple[list[bytes], Any]] = []
        self.table = self  # the models' lanes, as the engine's Dispatcher.table answers

    def is_open(self, model: int) -> bool:
        return True

    def priority(self, model: int) -> int:  # every model interactive, as without a table's
        return 0

    def name(self, model: int) -> str:
        return str(model)

    def room(self, n: int, whole: bool, priority: int = 0, model: int = 0) -> int:
        return n

    def clock(self) -> int:
        return 0

    def delay_ns(self, model: int = 0, priority: int = 0, now: int = 0) -> int:
        return 0

    @property
    def depth(self) -> int:
        return sum(len(texts) for texts, _ in self.owed)

    def admit(self, texts: list[bytes], costs: list[int], deadline: int, done: Any, *_: Any):
        self.owed.append((texts, done))

    def answer(self) -> None:
        scores = np.zeros(2, dtype=np.float32)
        while self.owed:
            texts, done = self.owed.pop(0)
            done([Result(L.STATUS_OK, label_id=0, scores=scores) for _ in texts])


def binary_conn() -> tuple[BinaryProtocol, Transport, Dispatcher]:
    dispatcher = Dispatcher()
    manifest = SimpleNamespace(
        embed_only=False, normalize=False, token_classifies=False, task=["classify"]
    )
    model = SimpleNamespace(name="m", version=1, index=0, manifest=manifest)
    host = SimpleNamespace(
        settings=Config(),
        draining=False,
        keys=None,
        models=ModelSet(model),
        admission=Admission(dispatcher, lambda: "queue is full", 30.0),  # the real admission
        count=lambda *_: None,
    )
    conn, transport = BinaryProtocol(BinaryServerState(host)), Transport()
    conn.connection_made(transport)
    return conn, transport, dispatcher


def test_one_binary_read_parses_a_bounded_number_of_frames() -> None:
    conn, transport, dispatcher = binary_conn()
    seen: list[Any] = []

    def first_turn() -> None:
        conn.data_received(b"".join(encode_frame("ok", tag) for tag in range(1, 3001)))
        seen.extend([dispatcher.depth, transport.reading])

    in_loop(first_turn)
    assert seen == [FRAMES_PER_TURN, False]
    assert dispatcher.depth == 3000 and transport.reading
    dispatcher.answer()
    assert len(AnswerParser().feed(transport.written)) == 3000


def test_a_flood_of_bad_frames_ends_the_connection() -> None:
    conn, transport, dispatcher = binary_conn()
    bad = b"".join(encode_frame(b"\xff", tag) for tag in range(1, 2 * GARBAGE_BURST))
    t0 = time.monotonic()
    in_loop(lambda: conn.data_received(bad + encode_frame("ok", 99999)))
    # the budget refills at GARBAGE_RATE a second of the real clock: on a loaded machine the
    # parse itself can take long enough to earn a few more answers
    refilled = int((time.monotonic() - t0) * GARBAGE_RATE) + 1
    answers = AnswerParser().feed(transport.written)
    assert transport.closed and not dispatcher.depth
    assert GARBAGE_BURST + 1 <= len(answers) <= GARBAGE_BURST + 1 + refilled
    assert {a.status for a in answers} == {1}
