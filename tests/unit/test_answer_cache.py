"""The answer cache (service/engine/cache.py) in process: LRU order, the byte bound against what
its entries really hold (tracemalloc), the counts, a model's drop refusing late answers, and
the rows it keeps written as they would be with any other texts (service/protocols/cached.py)."""

from __future__ import annotations

import gc
import json
import tracemalloc

import numpy as np
import orjson
from ringserve.service.engine.cache import (
    ENTRY_OVERHEAD,
    FRAGMENT_OVERHEAD,
    WRITTEN,
    AnswerCache,
    Key,
)
from ringserve.service.engine.requests import Result
from ringserve.service.protocols import compact, tasks
from ringserve.service.protocols.cached import Written
from ringserve.shm import layout as L


def answer(i: int, d: int = 384) -> Result:
    """A result as Result.from_ring makes it: a vector read out of a ring payload's bytes."""
    payload = bytes(L.RESPONSE_SIZE) + np.full(d, i, dtype="<f4").tobytes()
    scores = np.frombuffer(payload, dtype="<f4", count=d, offset=L.RESPONSE_SIZE)
    return Result(L.STATUS_OK, 0, scores, tokens=7)


def key(i: int, model: int = 0) -> Key:
    return ("sha256:f", model, L.OPT_EMBED, b"text number %d, a sentence of a chunk" % i)


def test_least_recently_used_goes_first_and_counts() -> None:
    size = ENTRY_OVERHEAD + len(key(0)[3]) + 4 * 384
    cache = AnswerCache(3 * size)
    for i in range(3):
        cache.put(key(i), answer(i), 0)
    got = cache.get(key(0))  # now the most recent
    assert got is not None and float(got.result.scores[0]) == 0.0  # type: ignore[index]
    assert got.result.tokens == 7
    cache.put(key(3), answer(3), 0)  # evicts 1, the least recently used
    assert cache.get(key(1)) is None and cache.get(key(0)) is not None
    assert (cache.counts.hits, cache.counts.misses, cache.counts.evictions) == (2, 1, 1)
    assert cache.bytes == 3 * size == sum(e.size for e in cache.entries.values())


def test_memory_stays_within_the_bound() -> None:
    """What the entries hold, measured, never passes --cache-bytes: ENTRY_OVERHEAD covers the
    objects around each vector."""
    capacity = 4 << 20
    results = [answer(i) for i in range(4000)]
    keys = [key(i) for i in range(4000)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache = AnswerCache(capacity)
    for k, r in zip(keys, results, strict=True):
        cache.put(k, r, 0)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert cache.counts.evictions > 0 and cache.bytes <= capacity
    assert held <= capacity, (held, capacity)
    per_entry = (held - 4 * 384 * len(cache.entries)) / len(cache.entries)
    assert per_entry + len(keys[0][3]) <= ENTRY_OVERHEAD + len(keys[0][3]), per_entry


def test_written_rows_count_in_the_bound() -> None:
    """With a route's JSON row kept beside each vector (made, and its form named, afresh each
    request, as a route does), what the entries hold still stays within --cache-bytes, and
    ENTRY_OVERHEAD and FRAGMENT_OVERHEAD cover the objects around each vector and its row."""
    capacity = 4 << 20
    results = [answer(i) for i in range(3000)]
    keys = [key(i) for i in range(3000)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache = AnswerCache(capacity)
    for i, (k, r) in enumerate(zip(keys, results, strict=True)):
        cache.put(k, r, 0)
        entry = cache.get(k)
        assert entry is not None
        row = orjson.dumps(np.full(384, i / 7, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY)
        cache.write(k, entry, ("openai", "float", bool(i % 2), 0), row)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    n = len(cache.entries)
    rows = sum(len(b) for e in cache.entries.values() for b in (e.written or {}).values())
    assert cache.counts.evictions > 0 and cache.bytes <= capacity
    assert all(e.written for e in cache.entries.values()), "every kept text kept its row"
    assert cache.bytes == sum(e.size for e in cache.entries.values())
    assert held <= capacity, (held, capacity)
    around = (held - 4 * 384 * n - rows) / n  # the objects around a vector and its row
    assert around <= ENTRY_OVERHEAD + FRAGMENT_OVERHEAD, around


def test_a_text_keeps_its_latest_forms_and_only_while_it_is_held() -> None:
    cache = AnswerCache(1 << 20)
    cache.put(key(0), answer(0), 0)
    entry = cache.get(key(0))
    assert entry is not None
    base = entry.size
    for form in range(WRITTEN + 2):
        cache.write(key(0), entry, form, b"[%d]" % form)
    assert entry.written is not None and list(entry.written) == list(range(2, WRITTEN + 2))
    assert entry.size == base + WRITTEN * (FRAGMENT_OVERHEAD + 3) == cache.bytes
    cache.write(key(0), entry, 3, b"[other]")  # a form kept is kept as it was written
    assert entry.written[3] == b"[3]"
    cache.put(key(0), answer(0), 0)  # replaced: the old entry's rows are not the new one's
    cache.write(key(0), entry, "late", b"[0]")
    fresh = cache.get(key(0))
    assert fresh is not None and fresh is not entry and fresh.written is None
    assert cache.bytes == fresh.size == base
    cache.forget(0)
    cache.write(key(0), fresh, "late", b"[0]")  # dropped: nothing to keep it in
    assert cache.bytes == 0 and not cache.entries


def test_a_row_that_would_pass_the_bound_is_not_kept() -> None:
    size = ENTRY_OVERHEAD + len(key(0)[3]) + 4 * 384
    cache = AnswerCache(size + FRAGMENT_OVERHEAD + 10)
    cache.put(key(0), answer(0), 0)
    entry = cache.get(key(0))
    assert entry is not None
    cache.write(key(0), entry, "big", bytes(11))
    assert entry.written is None and cache.bytes == size
    cache.write(key(0), entry, "fits", bytes(10))
    assert entry.written == {"fits": bytes(10)} and cache.bytes == cache.capacity


def test_a_drop_forgets_the_model_and_refuses_answers_asked_before() -> None:
    cache = AnswerCache(1 << 20)
    cache.put(key(1, model=0), answer(1), 0)
    cache.put(key(1, model=1), answer(1), 0)
    asked = cache.generation(0)
    cache.forget(0)
    assert cache.get(key(1, model=0)) is None and cache.get(key(1, model=1)) is not None
    cache.put(key(2, model=0), answer(2), asked)  # asked before the drop: not kept
    assert cache.get(key(2, model=0)) is None and cache.counts.dropped == 1
    cache.put(key(2, model=0), answer(2), cache.generation(0))
    assert cache.get(key(2, model=0)) is not None


def test_off_keeps_nothing() -> None:
    cache = AnswerCache(0)
    cache.put(key(0), answer(0), 0)
    assert not cache.entries and cache.bytes == 0


# -- hits are exact: a kept row is the bytes the text would be written as with any others -------
def vectors_as_results(n: int, d: int = 24) -> list[Result]:
    rng = np.random.default_rng(59)
    return [
        Result(L.STATUS_OK, 0, rng.standard_normal(d).astype(np.float32) * 3, tokens=3 + i)
        for i in range(n)
    ]


def route_forms(ranges: np.ndarray) -> list[tuple[str, Written]]:
    """Every way /v1/embeddings and /embed write a row."""
    found = []
    for fmt in ("float", "base64", *compact.COMPACT):
        calibrated = ranges if fmt in compact.CALIBRATED else None
        for normalize in (False, True):
            found.append((fmt, tasks.tei_written(fmt, calibrated, normalize)))
            found.append((fmt, tasks.openai_written("mödel", fmt, calibrated, normalize, 0)))
        if fmt not in compact.CALIBRATED:  # OpenAI's dimensions: cut, then renormalized
            found.append((fmt, tasks.openai_written("m", fmt, None, True, 7)))
    return found


def test_a_row_is_the_same_bytes_whatever_it_was_written_with() -> None:
    results = vectors_as_results(9)
    vecs = np.stack([r.scores for r in results])  # type: ignore[misc]
    ranges = np.array([vecs.min(0), vecs.max(0)], np.float32)
    tokens = sum(r.tokens for r in results)
    for fmt, written in route_forms(ranges):
        answer = written(results)
        alone = [written.rows([r])[0] for r in results]
        evens, odds = written.rows(results[::2]), written.rows(results[1::2])
        assert written.rows(results) == alone, (fmt, written.form)
        assert alone[::2] == evens and alone[1::2] == odds, (fmt, written.form)
        assert written.whole(alone, tokens) == answer, (fmt, written.form)


def test_the_answers_are_written_as_before_the_rows_were_kept() -> None:
    """TEI's matrix is the bytes one orjson call writes for it; OpenAI's `usage` and `model`
    are json.dumps's, as they were."""
    results = vectors_as_results(5)
    tokens = sum(r.tokens for r in results)
    for normalize in (False, True):
        vecs = tasks.vectors(results, normalize)
        assert tasks.tei_written("float", None, normalize)(results) == tasks.float_json(vecs)
        ubinary = orjson.dumps(compact.quantize(vecs, "ubinary"), option=orjson.OPT_SERIALIZE_NUMPY)
        assert tasks.tei_written("ubinary", None, normalize)(results) == ubinary
    answer = tasks.openai_written("mödel", "float", None, True, 0)(results)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    tail = f',"model":{json.dumps("mödel")},"usage":{json.dumps(usage)}}}'.encode()
    assert answer.endswith(tail)
    doc = json.loads(answer)
    assert [d["index"] for d in doc["data"]] == list(range(5))
    got = np.array([d["embedding"] for d in doc["data"]], np.float32)
    assert (got == tasks.vectors(results, True)).all()
