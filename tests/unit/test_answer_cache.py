"""The answer cache (service/engine/cache.py) in process: LRU order, the byte bound against what
its entries really hold (tracemalloc), the counts, and a model's drop refusing late answers."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
from ringserve.service.engine.cache import ENTRY_OVERHEAD, AnswerCache, Key
from ringserve.service.engine.requests import Result
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
    assert got is not None and float(got.scores[0]) == 0.0 and got.tokens == 7  # type: ignore[index]
    cache.put(key(3), answer(3), 0)  # evicts 1, the least recently used
    assert cache.get(key(1)) is None and cache.get(key(0)) is not None
    assert (cache.counts.hits, cache.counts.misses, cache.counts.evictions) == (2, 1, 1)
    assert cache.bytes == 3 * size == sum(s for _, s in cache.entries.values())


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
