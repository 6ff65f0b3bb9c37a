"""wire/frames.py, the binary protocol's bytes: frames and answers as CONTRACT.md writes them,
read back whole, cut anywhere, and stopped where the contract says."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from ringserve.wire.frames import (
    AUTH_PREFIX,
    BAD_REQUEST,
    OK,
    TRUNCATED,
    WINDOWED,
    Answer,
    AnswerParser,
    auth_frame,
    encode_answer,
    encode_frame,
    iter_frames,
    model_frame,
    parse_answers,
    parse_model_selection,
    status_answer,
)


def test_a_frame_is_length_text_tag_little_endian() -> None:
    frame = encode_frame("café", 0x0102030405060708)
    assert frame == struct.pack("<I", 5) + "café".encode() + struct.pack("<Q", 0x0102030405060708)
    assert encode_frame(b"\xff raw", 1)[4:-8] == b"\xff raw"  # bytes go as they are
    assert auth_frame("k3y") == encode_frame(AUTH_PREFIX + b"k3y", 0)


def test_an_answer_is_tag_status_flags_label_n_scores() -> None:
    scores = np.array([0.25, 0.75], dtype="<f4")
    data = encode_answer(9, OK, 1, scores.tobytes(), TRUNCATED | WINDOWED)
    assert data == struct.pack("<QBBHH2f", 9, OK, 3, 1, 2, 0.25, 0.75)
    assert status_answer(4, BAD_REQUEST) == struct.pack("<QBBHH", 4, BAD_REQUEST, 0, 0, 0)
    answers, used = parse_answers(data + status_answer(4, BAD_REQUEST))
    assert used == len(data) + 14  # a status answer is the 14-byte head alone
    assert answers == [Answer(9, OK, 1, [0.25, 0.75], 3), Answer(4, BAD_REQUEST)]
    assert answers[0].ok and not answers[1].ok and answers[1].status_name == "bad request"


def test_iter_frames_stops_at_a_partial_frame_or_an_oversize_length() -> None:
    frames = encode_frame("one", 1) + encode_frame("", 2) + encode_frame("three", 3)
    assert list(iter_frames(frames, 16)) == [(1, b"one"), (2, b""), (3, b"three")]
    assert list(iter_frames(frames[:-1], 16)) == [(1, b"one"), (2, b"")]
    oversize = struct.pack("<I", 17) + b"x" * 17 + struct.pack("<Q", 4)
    assert list(iter_frames(frames + oversize + encode_frame("late", 5), 16))[-1] == (3, b"three")


def test_parse_answers_leaves_a_partial_answer() -> None:
    data = encode_answer(1, OK, 0, np.ones(3, dtype="<f4").tobytes())
    answers, used = parse_answers(data + data[:-1])
    assert [a.tag for a in answers] == [1] and used == len(data)


@given(
    answers=st.lists(
        st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 6), st.integers(0, 4)), max_size=8
    ),
    cuts=st.lists(st.integers(0, 400), max_size=12),
)
def test_the_answer_parser_gives_the_same_answers_however_the_bytes_are_cut(
    answers: list[tuple[int, int, int]], cuts: list[int]
) -> None:
    data = b"".join(
        encode_answer(tag, status, n, np.arange(n, dtype="<f4").tobytes())
        for tag, status, n in answers
    )
    points = [0, *sorted(c for c in cuts if c < len(data)), len(data)]
    parser = AnswerParser()
    got = [a for i in range(len(points) - 1) for a in parser.feed(data[points[i] : points[i + 1]])]
    assert got == parse_answers(data)[0]
    assert [(a.tag, a.status, len(a.scores)) for a in got] == answers
    assert parser.buffer == b""


def test_a_model_frame_is_tag_0_model_name_version() -> None:
    assert model_frame("nli") == encode_frame("MODEL nli", 0)
    assert model_frame("nli", 2) == encode_frame("MODEL nli:2", 0)
    assert parse_model_selection(b"MODEL nli:2") == ("nli", "2")
    assert parse_model_selection(b"MODEL  nli ") == ("nli", None)
    assert parse_model_selection(b"MODEL org:nli") == ("org:nli", None)  # a version is digits
    assert parse_model_selection(b"MODEL org:nli:3") == ("org:nli", "3")
    assert parse_model_selection(b"MODEL ") == ("", None)  # names nothing: no model has it
    assert parse_model_selection(b"MODEL \xff") == ("", None)
    assert parse_model_selection(b"MODELS nli") is None  # an ordinary text
    assert parse_model_selection(b"a film") is None
