"""The framed binary TCP protocol against a real server, through service.client and raw sockets."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from ringserve.wire.client import AsyncBinaryClient, BinaryClient, UnknownModelError
from ringserve.wire.frames import (
    BAD_REQUEST,
    DEADLINE,
    LENGTH,
    OK,
    OVERLOADED,
    UNKNOWN_MODEL,
    Answer,
    AnswerParser,
    encode_frame,
    model_frame,
)

from devkit.server import ServerProc

pytestmark = pytest.mark.timeout(240)
MAX_FRAME = 65536


def connect(srv: ServerProc) -> BinaryClient:
    return BinaryClient("127.0.0.1", srv.binary_port, timeout=120)


def recv_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_answer_matches_http(server: ServerProc, sst2_texts: list[str]) -> None:
    texts = sst2_texts[:5]
    want = server.classify(texts)["results"]
    with connect(server) as client:
        first = client.classify(texts[0])
        answers = client.classify_many(texts)
    assert first.ok and first.label_id == want[0]["label_id"]
    for answer, result in zip(answers, want, strict=True):
        assert answer.status == OK and answer.label_id == result["label_id"]
        np.testing.assert_allclose(answer.scores, result["scores"], atol=1e-5)


def test_pipelined_burst_answered_once(server: ServerProc, sst2_texts: list[str]) -> None:
    """520 frames in one write: more than a connection may owe (256). Each frame is answered
    exactly once: those within the bound with their scores, those past it status 2 at once
    (none is left unread in the socket)."""
    texts = [sst2_texts[i % 50] for i in range(520)]
    frames = b"".join(encode_frame(t, 1000 + i) for i, t in enumerate(texts))
    seen: dict[int, int] = {}
    parser = AnswerParser()
    with socket.create_connection(("127.0.0.1", server.binary_port), timeout=120) as sock:
        sock.sendall(frames)  # the kernel buffers hold what the server does not read yet
        while len(seen) < len(texts):
            chunk = sock.recv(65536)
            assert chunk, f"closed with {len(texts) - len(seen)} answers owed"
            for a in parser.feed(chunk):
                assert a.tag not in seen, f"tag {a.tag} answered twice"
                assert a.status in (OK, OVERLOADED), a
                seen[a.tag] = a.label_id if a.status == OK else -1
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing more: every frame was answered exactly once
    assert sorted(seen) == list(range(1000, 1520))
    ok = [tag for tag, label in seen.items() if label >= 0]
    print(f"binary burst: 520 frames, {len(ok)} answered ok, {520 - len(ok)} status 2")
    assert len(ok) >= 256  # the bound itself is admitted
    by_text: dict[str, int] = {}
    for tag in ok:
        t = texts[tag - 1000]
        assert by_text.setdefault(t, seen[tag]) == seen[tag]


def test_parallel_connections(server: ServerProc, sst2_texts: list[str]) -> None:
    texts = sst2_texts[100:110]
    want = [r["label_id"] for r in server.classify(texts)["results"]]

    def run(_: int) -> list[int]:
        with connect(server) as client:
            return [a.label_id for a in client.classify_many(texts) if a.ok]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, range(16)))
    assert all(r == want for r in results)


def test_bad_frames_answered_and_connection_kept(server: ServerProc) -> None:
    with connect(server) as client:
        answers = client.classify_many(["fine", "", "   \n\t", b"\xff\xfe\xfd", b"ok\xc3", "good"])
        statuses = [a.status for a in answers]
        assert statuses == [OK, BAD_REQUEST, BAD_REQUEST, BAD_REQUEST, BAD_REQUEST, OK]
        assert all(a.scores == [] and a.label_id == 0 for a in answers if not a.ok)
        assert client.classify("still here").ok


def test_oversize_closes_after_owed_answers(server: ServerProc) -> None:
    frames = b"".join(encode_frame(f"sentence {i}", i) for i in range(5))
    oversize = LENGTH.pack(MAX_FRAME + 1) + b"x" * (1 << 20)  # and more after it
    with socket.create_connection(("127.0.0.1", server.binary_port), timeout=60) as sock:
        sock.sendall(frames + oversize)  # the server drops what follows the oversize length
        answers = AnswerParser().feed(recv_all(sock))  # ends with EOF: no timeout, no reset
    assert sorted(a.tag for a in answers) == list(range(5))
    assert all(a.status == OK for a in answers)
    with connect(server) as client:  # the server and other connections carry on
        assert client.classify("after the oversize frame").ok


def test_length_at_limit_is_served(server: ServerProc) -> None:
    with connect(server) as client:
        answer = client.classify("word " * (MAX_FRAME // 5))  # exactly the limit; truncated
    assert answer.ok


def test_eof_after_frames_still_answers(server: ServerProc) -> None:
    # More frames than a connection may owe: some are still buffered when EOF arrives.
    frames = b"".join(encode_frame(f"half closed {i}", i) for i in range(270))
    with socket.create_connection(("127.0.0.1", server.binary_port), timeout=60) as sock:
        sock.sendall(frames + b"\x05\x00")  # then a partial frame, then EOF
        sock.shutdown(socket.SHUT_WR)
        answers = AnswerParser().feed(recv_all(sock))
    assert sorted(a.tag for a in answers) == list(range(270))


def test_async_client_many_tasks_one_connection(server: ServerProc, sst2_texts: list[str]) -> None:
    texts = sst2_texts[200:264]
    want = [r["label_id"] for r in server.classify(texts)["results"]]

    async def main() -> list[int]:
        async with await AsyncBinaryClient.connect("127.0.0.1", server.binary_port) as client:
            answers = await asyncio.gather(*(client.classify(t) for t in texts))
            bad = await client.classify(b"\xff")
            assert bad.status == BAD_REQUEST
            return [a.label_id for a in answers if a.ok]

    assert asyncio.run(main()) == want


def test_model_selection(server: ServerProc, sst2_texts: list[str]) -> None:
    """`MODEL name[:version]` (tag 0): the only model by name serves as no selection does; an
    unknown one answers status 5, and so do the frames after it, until a model it holds."""
    name = json.loads(server.request("GET", "/v1/model")[2])["name"]
    text = sst2_texts[0]
    want = server.classify([text])["results"][0]
    with connect(server) as client:
        assert client.select_model(name).status == OK
        assert client.select_model(name, 1).status == OK
        answer = client.classify(text)
        assert answer.ok and answer.label_id == want["label_id"]
        np.testing.assert_allclose(answer.scores, want["scores"], atol=1e-5)
        with pytest.raises(UnknownModelError):
            client.select_model("no-such-model")
        assert [a.status for a in client.classify_many([text, text])] == [UNKNOWN_MODEL] * 2
        with pytest.raises(UnknownModelError):
            client.select_model(name, 2)
        assert client.classify(text).status == UNKNOWN_MODEL
        client.select_model(name)
        assert client.classify(text).ok

    async def pipelined() -> list[int]:
        async with await AsyncBinaryClient.connect("127.0.0.1", server.binary_port) as client:
            await client.select_model(name)
            return [a.status for a in await client.classify_many([text] * 4)]

    assert asyncio.run(pipelined()) == [OK] * 4
    with socket.create_connection(("127.0.0.1", server.binary_port), timeout=60) as sock:
        # One write: a frame, a selection of an unknown model, a frame (status 5), then EOF.
        sock.sendall(encode_frame(text, 1) + model_frame("nope") + encode_frame(text, 2))
        sock.shutdown(socket.SHUT_WR)
        answers = {a.tag: a.status for a in AnswerParser().feed(recv_all(sock))}
    assert answers == {1: OK, 0: UNKNOWN_MODEL, 2: UNKNOWN_MODEL}


def test_overload_and_deadline(start_server: Callable[..., ServerProc]) -> None:
    """Room for one request, and a deadline that passes at once: statuses 2 and 3."""
    srv = start_server(
        "--workers", "1", "--spares", "0", "--max-queue", "1", "--request-timeout-s", "0.000001"
    )
    with socket.create_connection(("127.0.0.1", srv.binary_port), timeout=60) as sock:
        sock.sendall(b"".join(encode_frame(f"text {i}", i) for i in range(200)))
        parser = AnswerParser()
        answers: list[Answer] = []
        while len(answers) < 200:
            chunk = sock.recv(65536)
            assert chunk
            answers += parser.feed(chunk)
    assert sorted(a.tag for a in answers) == list(range(200))
    statuses = {a.status for a in answers}
    assert statuses == {OVERLOADED, DEADLINE}
