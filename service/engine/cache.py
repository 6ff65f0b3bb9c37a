"""The answer cache (--cache-bytes): an in-memory LRU of the embeddings texts were answered
with, so a text seen before is answered by the front-end alone, from one dict lookup, and never
reaches admission, the queue or a worker.

A key is everything that changes a worker's answer to a text: the model's fingerprint and wire
index (one loaded artifact, at its precision and on its runtime), the text's options byte
(shm/layout.py OPT_*: truncation, its direction, the embedding asked for) and its payload as
written to the ring (the prompt already before the text). What a route does after the answer
(OpenAI's `dimensions`, a compact encoding, TEI's `normalize`) is cut from the cached vector
each time, so those options share one entry and the answer is the same to the byte, cached or
not. A reload or an unload drops the model's entries (`forget`), once when the model set
changes and once when the pool has rolled onto the new artifact: an answer a worker of the old
one gave during the roll never outlives it, and one asked for before a drop is never stored
after it (the model's generation). Bounded in bytes: each entry counts its key's payload, its
vector and ENTRY_OVERHEAD for the Python objects around them (tests/unit/test_answer_cache.py
measures what an entry really holds against it).

An entry also keeps the JSON its vector was written as by the routes that asked for it (at most
WRITTEN forms a text, each under what it depends on beyond the key: the route, its encoding,
`dimensions`, `normalize`), so a hit writes no float again: writing was two thirds of a hit's
cost in the handler. Those bytes count in the bound too, FRAGMENT_OVERHEAD each beside their
length."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
from ringserve.service.engine.requests import Result

# The bytes an entry holds beyond its payload and its vector's floats: the key tuple and the
# payload's bytes object header, the Result, the ndarray header and the dict's own node and
# table slot. Measured with tracemalloc on CPython 3.11 (the unit test): about 420 bytes.
ENTRY_OVERHEAD = 512
# A kept JSON form's bytes beyond its own: its bytes object header, the tuple naming the form
# and its slot in the entry's dict (the dict itself, for the first). Measured as above: about
# 350 bytes for a text's first row.
FRAGMENT_OVERHEAD = 384
WRITTEN = 4  # JSON forms kept a text; the oldest goes for a fifth
Key = tuple[str, int, int, bytes]  # fingerprint, model index, options byte, payload


class Entry:
    """A text's answer (its vector a copy of its own) and the JSON forms routes wrote it as."""

    __slots__ = ("result", "size", "written")

    def __init__(self, result: Result, size: int) -> None:
        self.result = result
        self.size = size  # counted in the bound: ENTRY_OVERHEAD, payload, vector, forms
        self.written: dict[Hashable, bytes] | None = None


@dataclass
class CacheCounts:
    hits: int = 0
    misses: int = 0
    evictions: int = 0  # entries pushed out by the byte bound
    dropped: int = 0  # entries dropped by a reload or an unload


class AnswerCache:
    """An LRU of Results by Key, at most `capacity` bytes (0: off, nothing stored)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[Key, Entry] = OrderedDict()
        self.bytes = 0
        self.counts = CacheCounts()
        self.generations: dict[int, int] = {}  # model index -> drops so far

    def get(self, key: Key) -> Entry | None:
        found = self.entries.get(key)
        if found is None:
            self.counts.misses += 1
            return None
        self.entries.move_to_end(key)
        self.counts.hits += 1
        return found

    def generation(self, model: int) -> int:
        return self.generations.get(model, 0)

    def put(self, key: Key, result: Result, generation: int) -> Entry | None:
        """Keep a text's successful answer, unless its model was dropped since it was asked
        (`generation`), or it alone would pass the bound; evicts the least recently used. The
        entry kept, or None."""
        if result.scores is None or self.generations.get(key[1], 0) != generation:
            return None
        size = ENTRY_OVERHEAD + len(key[3]) + 4 * len(result.scores)
        if size > self.capacity:
            return None
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        # a copy of the vector alone: the ring payload it points into holds the header too
        kept = Result(
            result.status, result.label_id, np.array(result.scores, dtype=np.float32),
            flags=result.flags, tokens=result.tokens, windows=result.windows,
        )  # fmt: skip
        entry = self.entries[key] = Entry(kept, size)
        self.bytes += size
        self.evict()
        return entry

    def write(self, key: Key, entry: Entry, form: Hashable, fragment: bytes) -> None:
        """Keep `fragment`, the JSON `entry`'s vector is written as in `form` (what it depends
        on beyond the key), while the entry is the key's and fits the bound with it."""
        if self.entries.get(key) is not entry:  # dropped, pushed out or replaced since
            return
        size = FRAGMENT_OVERHEAD + len(fragment)
        if entry.size + size > self.capacity:
            return
        written = entry.written
        if written is None:
            written = entry.written = {}
        elif form in written:
            return
        elif len(written) >= WRITTEN:  # the oldest form goes
            gone = written.pop(next(iter(written)))
            entry.size -= FRAGMENT_OVERHEAD + len(gone)
            self.bytes -= FRAGMENT_OVERHEAD + len(gone)
        # a copy of its length: orjson's bytes keep the buffer it wrote into, about twice that
        written[form] = bytes(memoryview(fragment))
        entry.size += size
        self.bytes += size
        self.evict()

    def evict(self) -> None:
        """The least recently used out until the entries fit the bound."""
        while self.bytes > self.capacity:
            _, gone = self.entries.popitem(last=False)
            self.bytes -= gone.size
            self.counts.evictions += 1

    def forget(self, model: int) -> None:
        """Drop every entry of the model at wire index `model` (a reload or an unload), and
        refuse the answers asked for before now."""
        self.generations[model] = self.generations.get(model, 0) + 1
        going = [k for k in self.entries if k[1] == model]
        for k in going:
            self.bytes -= self.entries.pop(k).size
        self.counts.dropped += len(going)
