"""Compact vectors (service/protocols/compact.py) and late chunking's planning
(service/protocols/late_chunking.py) in process: the cut against its definition, an artifact
built before calibration was stored, and the spans and windows of a document."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from ringserve.service.protocols import compact
from ringserve.service.protocols.late_chunking import best_window, chunk_bounds, owners, windows
from ringserve.service.request.errors import RequestError


def info(extra: dict[str, Any], fingerprint: str = "sha256:old") -> Any:
    manifest = SimpleNamespace(fingerprint=fingerprint, extra=extra, normalize=True)
    return SimpleNamespace(name="m", manifest=manifest)


def test_the_cut_is_sentence_transformers_definition() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((20, 19)).astype(np.float32)
    ranges = np.array([vectors.min(0), vectors.max(0)], np.float32)
    steps = (ranges[1] - ranges[0]) / 255
    buckets = np.clip(np.floor((vectors - ranges[0]) / steps), 0, 255)
    assert (compact.quantize(vectors, "uint8", ranges) == buckets).all()
    assert (compact.quantize(vectors, "int8", ranges) == buckets - 128).all()
    packed = np.packbits(vectors > 0, axis=-1)
    assert (compact.quantize(vectors, "ubinary") == packed).all()
    assert (compact.quantize(vectors, "binary") == packed.astype(int) - 128).all()
    assert compact.quantize(vectors, "binary").shape == (20, compact.width("binary", 19)) == (20, 3)


def test_an_artifact_without_calibration_serves_binary_and_refuses_int8() -> None:
    old = info({})
    assert compact.check(old, ["binary", "ubinary", "float"], cut=True) is None
    with pytest.raises(RequestError) as refused:
        compact.check(old, ["float", "int8"], cut=False)
    assert refused.value.status == 400 and "ringserve export" in refused.value.message
    stored = {"compact": {"calibration": {"min": [-1.0, 0.0], "max": [1.0, 2.0]}}}
    new = info(stored, "sha256:new")
    assert compact.check(new, ["uint8"], cut=False).tolist() == [[-1.0, 0.0], [1.0, 2.0]]
    with pytest.raises(RequestError, match="whole vectors"):
        compact.check(new, ["int8"], cut=True)
    with pytest.raises(RequestError, match="normalize true"):
        compact.check(new, ["int8"], cut=False, normalize=False)


def test_a_token_belongs_to_the_chunk_its_first_character_is_in() -> None:
    chunks = ["ab cd", "e", "fg"]  # joined: "ab cd e fg", after a 3-character prompt
    bounds = chunk_bounds(chunks, 3)
    assert bounds == [(3, 8), (9, 10), (11, 13)]
    offsets = [(0, 2), (3, 5), (6, 8), (9, 10), (11, 12), (12, 13), (13, 13)]
    assert owners(offsets, bounds) == [[1, 2], [3], [4, 5]]


def test_windows_start_and_end_on_words_and_overlap_by_half() -> None:
    starts = [True, False, True, True, False, False, True, True, False, True]
    assert windows(starts, 20) == [(0, 10)]
    got = windows(starts, 4)
    assert got[0] == (0, 3) and got[-1][1] == 10
    for a, b in got:
        assert starts[a] and (b == 10 or starts[b]) and b - a <= 4
    assert all(a2 < b1 for (_, b1), (a2, _) in itertools.pairwise(got))
    best = best_window([(0, 6), (3, 9)], 9)
    assert best == [0, 0, 0, 0, 0, 1, 1, 1, 1]  # token 4: a tie, the first window keeps it
