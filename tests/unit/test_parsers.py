"""The protocol parsers fed each message whole, one byte at a time and in random chunks.

However the bytes are cut, the answers must be the same. The production protocol objects
(HttpProtocol, BinaryProtocol) get each piece through data_received, as the event loop hands
them what a socket read returns, on a fake transport that records what they write
(devkit.fakes). Behind them, a router (HTTP) and a dispatcher (binary) answer from what was
parsed alone: every byte of the method, URL, headers and body (or the frame's text) shows in the
answer, so a parse that depends on the cuts changes an answer. No process, no model, no socket.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
import zlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ringserve.service.config.settings import Config
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.dispatcher import Result
from ringserve.service.models.modelset import UNLOADING, Entry, ModelSet
from ringserve.service.protocols.binary import BinaryProtocol, BinaryServerState
from ringserve.service.protocols.http import Exchange, HttpProtocol, HttpServerState
from ringserve.shm import layout as L
from ringserve.wire.frames import LENGTH, AnswerParser, encode_frame, model_frame

from devkit.fakes import Transport

pytestmark = pytest.mark.timeout(180)
CHUNKED = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- sending and reading ------------------------------------------------------------------------
def pieces(data: bytes, cuts: list[int] | str) -> list[bytes]:
    """`data` cut at the given offsets, or "whole", or "bytes" (one byte a piece)."""
    if isinstance(cuts, str):
        return [data] if cuts == "whole" else [data[i : i + 1] for i in range(len(data))]
    points = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


def read_http(data: bytes, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """`count` HTTP/1.1 answers with Content-Length bodies: all of `data`, nothing after."""
    buf = data
    out: list[tuple[int, dict[str, str], bytes]] = []
    while len(out) < count:
        assert b"\r\n\r\n" in buf, f"{len(out)} of {count} answers written"
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        length = int(headers["content-length"])
        assert len(buf) >= length, "the answer ends inside a body"
        out.append((status, headers, buf[:length]))
        buf = buf[length:]
    assert buf == b"", "more written than the answers owed"
    return out


def same(a: Any, b: Any) -> bool:
    """Equal, with floats within 1e-5 (the same text gives the same scores in any batch)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, abs_tol=1e-5)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


# -- HTTP -----------------------------------------------------------------------------------------
def http_request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    if body and "Transfer_Encoding" not in headers:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def http_messages(model: str) -> list[tuple[str, bytes, int]]:
    """(name, bytes, answers expected) for each message."""
    one = json.dumps({"text": "a thoroughly enjoyable caf\u00e9 film"}).encode()
    many = json.dumps({"texts": ["dreadful", "  a delight  ", "so-so"]}).encode()
    spec: dict[str, Any] = {"name": "text", "datatype": "BYTES", "shape": [1]}
    spec["parameters"] = {"binary_data_size": 12}
    outputs = [{"name": "scores"}, {"name": "label"}]
    head = json.dumps({"inputs": [spec], "outputs": outputs}).encode()
    blob = struct.pack("<I", 8) + b"gorgeous"
    return [
        ("get", http_request("GET", "/v1/model"), 1),
        ("post one", http_request("POST", "/v1/classify", one), 1),
        ("post many", http_request("POST", "/v1/classify", many), 1),
        (
            "pipelined pair",
            http_request("GET", "/v1/model") + http_request("POST", "/v1/classify", one),
            2,
        ),
        (
            "chunked body",
            http_request("POST", "/v1/classify", chunked(many, 7), Transfer_Encoding="chunked"),
            1,
        ),
        (
            "kserve binary",
            http_request(
                "POST",
                f"/v2/models/{model}/infer",
                head + blob,
                Inference_Header_Content_Length=str(len(head)),
            ),
            1,
        ),
        ("malformed json", http_request("POST", "/v1/classify", b'{"text": '), 1),
    ]


def echo(conn: HttpProtocol, ex: Exchange) -> None:
    """Answers with all it was given; a POST's JSON (the KServe binary extension's head only)
    must parse, else 400, as the routes answer malformed JSON."""
    body = b"".join(ex.body)
    doc: dict[str, Any] = {
        "method": ex.method.decode(),
        "url": ex.url.decode(),
        "headers": {k.decode(): v.decode() for k, v in sorted(ex.headers.items())},
        "body": body.decode("latin-1"),
    }
    if ex.method == b"POST":
        split = int(ex.headers.get(b"inference-header-content-length", len(body)))
        try:
            doc["json"] = json.loads(body[:split])
        except ValueError:
            conn.respond_error(ex, 400, "malformed JSON")
            return
    conn.respond(ex, 200, json.dumps(doc).encode())


def exchange_http(data: bytes, cuts: list[int] | str, count: int) -> list[Any]:
    state = HttpServerState(Config(), echo, lambda *_: None)
    conn, transport = HttpProtocol(state), Transport()
    conn.connection_made(transport)
    for piece in pieces(data, cuts):
        conn.data_received(piece)
    answers = read_http(transport.written, count)
    return [(status, json.loads(body)) for status, _, body in answers]


@pytest.fixture(scope="module")
def http_reference() -> dict[str, tuple[bytes, int, list[Any]]]:
    ref = {}
    for label, data, count in http_messages("sst2-minilm"):
        ref[label] = (data, count, exchange_http(data, "whole", count))
    return ref


def test_http_reference_answers(http_reference: dict[str, tuple[bytes, int, list[Any]]]) -> None:
    statuses = {k: [s for s, _ in v[2]] for k, v in http_reference.items()}
    assert statuses["pipelined pair"] == [200, 200]
    assert statuses["malformed json"] == [400]
    assert all(
        s == [200] for k, s in statuses.items() if k not in ("pipelined pair", "malformed json")
    )


def test_http_one_byte_at_a_time(http_reference: dict[str, tuple[bytes, int, list[Any]]]) -> None:
    for label, (data, count, want) in http_reference.items():
        assert same(exchange_http(data, "bytes", count), want), label


@CHUNKED
@given(data=st.data())
def test_http_random_chunks(
    http_reference: dict[str, tuple[bytes, int, list[Any]]], data: Any
) -> None:
    # Every message back to back on one connection, cut anywhere: one pipelined stream.
    stream = b"".join(v[0] for v in http_reference.values())
    want = [a for v in http_reference.values() for a in v[2]]
    cuts = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=40))
    assert same(exchange_http(stream, cuts, len(want)), want)


# -- binary frames --------------------------------------------------------------------------------
BINARY_TEXTS: list[str | bytes] = [
    "an absorbing drama",
    "",
    "flat, lifeless and far too long",
    b"\xc3\x28 invalid",
    "   ",
    "\u00e9l\u00e9gant et dr\u00f4le",
    "x" * 600,
]
OVERSIZE = LENGTH.pack(65537)


def binary_stream() -> bytes:
    """Frames (good and bad), then an oversize length that ends the connection."""
    frames = b"".join(encode_frame(t, 7 + 100 * i) for i, t in enumerate(BINARY_TEXTS))
    return frames + OVERSIZE


class Dispatcher:
    """Takes every frame the protocol admits, and answers them when the test says (as the
    workers would, between two reads): a label and scores made from the text and its options
    byte alone."""

    max_tokens = 512

    def __init__(self) -> None:
        self.owed: list[tuple[list[bytes], int, Any]] = []
        self.table = self  # the models' lanes, as the engine's Dispatcher.table answers

    def is_open(self, model: int) -> bool:  # every model the protocol selects is open here
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
        return 0  # nothing waits: the fake answers when the test says

    @property
    def depth(self) -> int:
        return sum(len(texts) for texts, _, _ in self.owed)

    def admit(
        self, texts: list[bytes], costs: list[int], deadline: int, done: Any, *rest: Any
    ) -> None:
        options = rest[5] if len(rest) > 5 else 0  # after protocol, task, level, tenant, model
        self.owed.append((texts, options, done))

    def refuse(self, n: int, model: int = 0) -> None:
        raise AssertionError(f"{n} frames refused: the fake has room for all")

    def answer(self) -> None:
        while self.owed:
            texts, options, done = self.owed.pop(0)
            done([score(t, options) for t in texts])


def score(text: bytes, options: int = 0) -> Result:
    text = bytes([options]) + text if options else text  # the options change the answer
    scores = np.array([len(text), zlib.crc32(text) % 1000 / 1000], dtype=np.float32)
    return Result(L.STATUS_OK, label_id=len(text) % 3, scores=scores)


def fake_model(name: str, index: int, embed_only: bool = False) -> Any:
    """What the binary protocol reads of a ModelInfo: its name, version, index and manifest."""
    manifest = SimpleNamespace(
        embed_only=embed_only, normalize=False, token_classifies=False, task=["classify"]
    )
    return SimpleNamespace(name=name, version=1, index=index, manifest=manifest)


def binary_host(dispatcher: Dispatcher, *more: Any) -> SimpleNamespace:
    """The binary protocol's server: the real admission and a real ModelSet (model `sst2`,
    and any `more`)."""
    models = ModelSet(fake_model("sst2", 0))
    for info in more:
        models.entries[(info.name, info.version)] = Entry(info)
    return SimpleNamespace(
        settings=Config(),
        draining=False,
        keys=None,
        models=models,
        admission=Admission(dispatcher, lambda: "queue is full", 30.0),  # the real admission
        count=lambda *_: None,
    )


def exchange_binary(cuts: list[int] | str) -> dict[int, tuple[int, int, list[float]]]:
    dispatcher = Dispatcher()
    host = binary_host(dispatcher)
    conn, transport = BinaryProtocol(BinaryServerState(host)), Transport()
    conn.connection_made(transport)
    for piece in pieces(binary_stream(), cuts):
        conn.data_received(piece)
        dispatcher.answer()
    assert transport.closed, "the oversize length closes the connection"
    answers = AnswerParser().feed(transport.written)
    got = {a.tag: (a.status, a.label_id, a.scores) for a in answers}
    assert len(got) == len(answers) == len(BINARY_TEXTS), "each frame answered exactly once"
    return got


@pytest.fixture(scope="module")
def binary_reference() -> dict[int, tuple[int, int, list[float]]]:
    ref = exchange_binary("whole")
    assert [ref[7 + 100 * i][0] for i in range(len(BINARY_TEXTS))] == [0, 1, 0, 1, 1, 0, 0]
    return ref


def test_binary_one_byte_at_a_time(
    binary_reference: dict[int, tuple[int, int, list[float]]],
) -> None:
    assert same(exchange_binary("bytes"), binary_reference)


@CHUNKED
@given(data=st.data())
def test_binary_random_chunks(
    binary_reference: dict[int, tuple[int, int, list[float]]], data: Any
) -> None:
    size = len(binary_stream())
    cuts = data.draw(st.lists(st.integers(1, size - 1), max_size=40))
    assert same(exchange_binary(cuts), binary_reference)


# -- MODEL frames ---------------------------------------------------------------------------------
EMBED = fake_model("minilm", 1, embed_only=True)  # its frames reach the worker marked OPT_EMBED


def model_stream() -> bytes:
    """With two models loaded: a frame before any selection (status 1: name one), a selection
    and its frames, an unknown model (its frames status 5), a selection with a version, and a
    tag that is not 0 (its text an ordinary one); then the oversize length."""
    return b"".join(
        [
            encode_frame("before", 1),
            model_frame("minilm"),
            encode_frame("for minilm", 2),
            model_frame("nope"),
            encode_frame("for nope", 3),
            model_frame("sst2", 1),
            encode_frame("for sst2", 4),
            encode_frame(b"MODEL minilm", 5),
            OVERSIZE,
        ]
    )


def exchange_models(cuts: list[int] | str) -> tuple[list[int], dict[int, Any]]:
    """(the statuses of the tag-0 answers in order, the other answers by tag)."""
    dispatcher = Dispatcher()
    conn, transport = BinaryProtocol(BinaryServerState(binary_host(dispatcher, EMBED))), Transport()
    conn.connection_made(transport)
    for piece in pieces(model_stream(), cuts):
        conn.data_received(piece)
        dispatcher.answer()
    assert transport.closed
    answers = AnswerParser().feed(transport.written)
    selections = [a.status for a in answers if a.tag == 0]
    got = {a.tag: (a.status, a.label_id, a.scores) for a in answers if a.tag}
    assert len(got) + len(selections) == len(answers), "each frame answered exactly once"
    return selections, got


@pytest.fixture(scope="module")
def model_reference() -> tuple[list[int], dict[int, Any]]:
    selections, got = exchange_models("whole")
    assert selections == [L.STATUS_OK, L.STATUS_UNKNOWN_MODEL, L.STATUS_OK]
    assert {t: a[0] for t, a in got.items()} == {
        1: L.STATUS_BAD_REQUEST,  # two models loaded and none selected
        2: L.STATUS_OK,
        3: L.STATUS_UNKNOWN_MODEL,
        4: L.STATUS_OK,
        5: L.STATUS_OK,
    }
    assert got[2][2] == pytest.approx(score(b"for minilm", L.OPT_EMBED).scores.tolist())
    assert got[4][2] == pytest.approx(score(b"for sst2").scores.tolist())
    assert got[5][2] == pytest.approx(score(b"MODEL minilm").scores.tolist())
    return selections, got


def test_model_frames_one_byte_at_a_time(model_reference: Any) -> None:
    assert same(exchange_models("bytes"), model_reference)


@CHUNKED
@given(data=st.data())
def test_model_frames_random_chunks(model_reference: Any, data: Any) -> None:
    cuts = data.draw(st.lists(st.integers(1, len(model_stream()) - 1), max_size=40))
    assert same(exchange_models(cuts), model_reference)


def test_a_model_unloaded_since_its_selection_answers_5() -> None:
    """Selected, then unloading (service/models/modelset.py: find() stops returning it): the frames
    after answer status 5 at once; with one model no selection is needed."""
    dispatcher = Dispatcher()
    host = binary_host(dispatcher, EMBED)
    conn, transport = BinaryProtocol(BinaryServerState(host)), Transport()
    conn.connection_made(transport)
    conn.data_received(model_frame("minilm") + encode_frame("one", 1))
    dispatcher.answer()
    host.models.entries[("minilm", 1)].state = UNLOADING
    conn.data_received(encode_frame("two", 2))
    assert not dispatcher.owed, "nothing admitted for an unloaded model"
    del host.models.entries[("minilm", 1)]  # gone: one model left, but minilm stays selected
    conn.data_received(encode_frame("three", 3))
    conn.data_received(model_frame("sst2") + encode_frame("four", 4))
    dispatcher.answer()
    answers = {a.tag: a.status for a in AnswerParser().feed(transport.written) if a.tag}
    assert answers == {1: L.STATUS_OK, 2: 5, 3: 5, 4: L.STATUS_OK}


def test_one_model_needs_no_selection() -> None:
    dispatcher = Dispatcher()
    conn, transport = BinaryProtocol(BinaryServerState(binary_host(dispatcher))), Transport()
    conn.connection_made(transport)
    conn.data_received(encode_frame("one", 1) + model_frame("sst2") + encode_frame("two", 2))
    conn.data_received(model_frame("sst2", 2) + encode_frame("three", 3))  # no version 2
    dispatcher.answer()
    answers = AnswerParser().feed(transport.written)
    assert [a.status for a in answers if a.tag == 0] == [L.STATUS_OK, L.STATUS_UNKNOWN_MODEL]
    assert {a.tag: a.status for a in answers if a.tag} == {1: 0, 2: 0, 3: 5}
