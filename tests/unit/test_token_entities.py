"""A token classifier's answer and its entities (workers/token_entities.py), on hand-made
windows: the pipeline's grouping, word and merging rules one by one, the answer's bytes, and the
stride a request sends in front of its text (workers/process/tokens.py). Equality with
transformers' own pipeline on real models is tests/system/test_token_classify.py's."""

from __future__ import annotations

import numpy as np
import pytest
from ringserve.shm import layout as L
from ringserve.workers import token_entities as te
from ringserve.workers.process.tokens import STRIDE_SHIFT, decode

LABELS = ["O", "B-PER", "I-PER", "LOC", "X-Y-Z"]


def window(
    top: list[int], score: float = 0.9, sub: list[bool] | None = None, at: int = 0
) -> te.Window:
    """Tokens of one character each, a space between them, each sure of its `top` label."""
    k = len(top)
    probs = np.full((k, len(LABELS)), (1 - score) / (len(LABELS) - 1), dtype=np.float32)
    probs[np.arange(k), top] = score
    starts = np.arange(at, at + 2 * k, 2, dtype=np.int32)
    subword = np.array(sub or [False] * k)
    return te.Window(probs, starts, starts + 1, subword)


def test_simple_groups_adjacent_tokens_of_one_tag() -> None:
    w = window([1, 2, 2, 0, 1, 1, 3, 3, 4])
    got = te.entities([w], LABELS, "simple")
    # B-PER I-PER I-PER | O | B-PER | B-PER (a B starts anew) | LOC LOC (no prefix joins) | X-Y-Z
    assert [(e[0], e[2], e[3]) for e in got] == [
        ("PER", 0, 5), ("PER", 8, 9), ("PER", 10, 11), ("LOC", 12, 15), ("Y-Z", 16, 17),
    ]  # fmt: skip
    assert all(e[1] == pytest.approx(0.9) for e in got)
    assert ("O", 6, 7) in [(e[0], e[2], e[3]) for e in te.entities([w], LABELS, "simple", ())]


def test_none_is_one_entity_a_token_and_ignores_whole_labels() -> None:
    w = window([1, 2, 0, 3])
    got = te.entities([w], LABELS, "none", ("O", "I-PER"))
    assert [(e[0], e[2]) for e in got] == [("B-PER", 0), ("LOC", 6)]


def test_words_agree_first_average_max() -> None:
    w = window([1, 3, 3], sub=[False, True, True])  # one word of three tokens
    w.probs[0] = [0.05, 0.5, 0.05, 0.35, 0.05]  # its first token: B-PER, not sure
    assert [e[0] for e in te.entities([w], LABELS, "first")] == ["PER"]
    assert [e[0] for e in te.entities([w], LABELS, "max")] == ["LOC"]  # 0.9 > 0.5
    avg = te.entities([w], LABELS, "average")
    assert [(e[0], e[2], e[3]) for e in avg] == [("LOC", 0, 5)]
    assert avg[0][1] == pytest.approx((0.35 + 0.9 + 0.9) / 3, abs=1e-6)
    # a first token marked subword still begins the text's first word
    w.subword[0] = True
    assert len(te.entities([w], LABELS, "first")) == 1


def test_overlapping_entities_merge_as_the_pipeline() -> None:
    found = [("PER", 0.8, 0, 10), ("PER", 0.9, 0, 10), ("LOC", 0.5, 4, 20), ("O", 0.9, 30, 31)]
    assert te.merge_overlapping(found) == [("LOC", 0.5, 4, 20), ("O", 0.9, 30, 31)]
    assert te.merge_overlapping(found[:2]) == [("PER", 0.9, 0, 10)]


def test_the_answer_round_trips_with_positions() -> None:
    a, b = window([1, 2, 0], at=0), window([0, 3, 3], at=2)
    a.positions, b.positions = np.arange(3, dtype=np.int32), np.arange(1, 4, dtype=np.int32)
    body = te.pack([a, b])
    assert len(body) == te.body_size(6, 2, len(LABELS))
    back = te.unpack(b"x" * L.RESPONSE_SIZE + body, 2, len(LABELS), L.RESPONSE_SIZE)
    for x, y in zip([a, b], back, strict=True):
        assert np.array_equal(x.probs, y.probs) and np.array_equal(x.starts, y.starts)
        assert np.array_equal(x.positions, y.positions)  # type: ignore[arg-type]
    one = te.unpack(te.pack([a]), 1, len(LABELS))[0]
    assert one.positions is None and np.array_equal(one.ends, a.ends)


def test_merged_tokens_take_each_token_once_with_the_most_context() -> None:
    a, b = window([1, 1, 1, 1], at=0), window([2, 2, 2, 2], at=4)  # b's first two are a's last
    a.positions, b.positions = np.arange(4, dtype=np.int32), np.arange(2, 6, dtype=np.int32)
    merged = te.merged_tokens([a, b])
    assert merged.starts.tolist() == [0, 2, 4, 6, 8, 10]
    # position 2: 1 token of context on a's right, 0 on b's left: a's; position 3: b's
    assert merged.probs.argmax(1).tolist() == [1, 1, 1, 2, 2, 2]
    # duplicate offsets (a byte-level BPE splits a character) stay two tokens
    c = window([1, 1], at=0)
    c.ends[:] = c.starts[:] = 0
    d = window([1, 1], at=0)
    d.ends[:] = d.starts[:] = 0
    c.positions, d.positions = np.array([0, 1], np.int32), np.array([2, 3], np.int32)
    assert len(te.merged_tokens([c, d])) == 4


def test_the_stride_rides_in_front_of_the_text() -> None:
    text, opts = decode(te.stride_prefix(300) + "Zürich".encode(), L.OPT_BULK)
    assert text == "Zürich" and opts >> STRIDE_SHIFT == 301 and opts & 0xFF == L.OPT_BULK
    assert decode(b"plain", 0) == ("plain", 0)
    assert decode(b"a" + L.PAIR_SEPARATOR + b"b", 0)[0] is None  # no pairs
    assert decode(b"\xfe\x01", 0)[0] is None  # a cut prefix
    assert decode(b"\xff\xfe", 0)[0] is None and decode(b"  ", 0)[0] is None
