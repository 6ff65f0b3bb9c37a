"""The SPSC ring's edge cases in one process, over real shared memory (the two-process tests are
in tests/system/test_ring_processes.py)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from ringserve.shm import layout as L
from ringserve.shm.ring import Ring, RingError
from ringserve.shm.segment import list_segments

from devkit.ring import PID, Scenario, new_segment, payload_for, scenario_ring, tail_of


@pytest.fixture(autouse=True)
def no_leftover_segments() -> Iterator[None]:
    yield
    assert list_segments(PID) == []


# -- in-process unit tests -----------------------------------------------------------------------
@contextlib.contextmanager
def local_ring(slot_size: int = 64, slot_count: int = 8, start: int = 0) -> Iterator[Ring]:
    sc = Scenario(slot_size, slot_count, start, 0, (), (1,), 1)
    with scenario_ring(sc) as (_seg, ring):
        yield ring


def test_header_validation() -> None:
    size = L.ring_bytes(64, 8)
    seg = new_segment(size)
    try:
        with pytest.raises(RingError, match="not a version"):
            Ring(seg)  # all zero: no magic
        L.RING_HEADER.pack_into(seg.buf, 0, L.MAGIC_RING, L.VERSION + 1, 64, 8)
        with pytest.raises(RingError, match="not a version"):
            Ring(seg)
        for slot_size, slot_count in [(64, 0), (64, 12), (60, 8), (32, 8), (64, 1 << 31)]:
            L.RING_HEADER.pack_into(seg.buf, 0, L.MAGIC_RING, L.VERSION, slot_size, slot_count)
            with pytest.raises(RingError, match="geometry"):
                Ring(seg)
            with pytest.raises(ValueError):
                Ring(seg, slot_size, slot_count)
        L.RING_HEADER.pack_into(seg.buf, 0, L.MAGIC_RING, L.VERSION, 64, 16)
        with pytest.raises(RingError, match="smaller"):
            Ring(seg)
        Ring(seg, 64, 8).close()
        Ring(seg).close()  # attaching to a valid header works
    finally:
        seg.close()
        seg.unlink()


def corrupt_record(ring: Ring, slot: int, **fields: int) -> None:
    names = ("msg_id", "aux", "length", "flags", "nslots", "meta")
    off = slot * ring.slot_size
    rec = dict(zip(names, L.RECORD.unpack_from(ring._data, off), strict=True))
    rec.update(fields)
    L.RECORD.pack_into(ring._data, off, *rec.values())


@pytest.mark.parametrize(
    "fields",
    [{"nslots": 0}, {"nslots": 3}, {"nslots": 2}, {"length": 33}, {"length": 1 << 31}],
    ids=["no-slots", "past-tail", "past-ring-end", "longer", "huge"],
)
def test_corrupt_record_detected(fields: dict[str, int]) -> None:
    with local_ring(64, 8, start=7) as ring:
        assert ring.write_many([(1, b"a" * 20, 0, 0), (2, b"b" * 20, 0, 0)]) == 2  # slots 7, 0
        corrupt_record(ring, 7, **fields)
        with pytest.raises(RingError):
            ring.read()


def test_max_payload_boundary() -> None:
    with local_ring(64, 8) as ring:
        top = ring.max_payload()
        assert top == 64 * 8 - L.RECORD_SIZE
        assert not ring.try_write(1, bytes(top + 1))  # bigger than the ring: never fits
        assert tail_of(ring) == 0 and ring.pending() == 0
        assert ring.try_write(2, payload_for(2, top))
        assert not ring.try_write(3, b"")  # full
        assert ring.read() == [(2, 0, 0, payload_for(2, top))]
        assert ring.try_write(4, payload_for(4, L.RECORD_SIZE))  # exactly one slot
        assert ring.try_write(5, payload_for(5, L.RECORD_SIZE + 1))  # two slots
        assert [m[0] for m in ring.read()] == [4, 5]
        assert tail_of(ring) == 8 + 1 + 2


@pytest.mark.parametrize("start", range(8))
@pytest.mark.parametrize("need", [5, 8])
def test_large_message_fits_from_any_position(start: int, need: int) -> None:
    """At slot s of an empty ring, a message of more than max(s, slots - s) slots needs the
    consumer to pass a PAD first: the PAD is published alone, and the next try fits."""
    with local_ring(64, 8, start) as ring:
        msg = (9, payload_for(9, need * 64 - L.RECORD_SIZE), -1, 0)
        if start + need > 8 and need > start:
            assert ring.write_many([msg]) == 0
            assert ring.pending() == 8 - start  # the PAD alone
            assert ring.read() == []
        assert ring.write_many([msg]) == 1
        assert ring.read() == [(9, -1, 0, msg[1])]


def test_too_big_publishes_nothing_anywhere() -> None:
    with local_ring(64, 8, start=5) as ring:
        assert ring.write_many([(1, bytes(ring.max_payload() + 1), 0, 0), (2, b"x", 0, 0)]) == 0
        assert tail_of(ring) == 5 and ring.pending() == 0


def test_write_many_partial_keeps_order() -> None:
    with local_ring(64, 8) as ring:
        msgs = [(i, payload_for(i, 20), -i, L.request_meta(i, i)) for i in range(12)]
        assert ring.write_many(msgs) == 8
        assert [m[0] for m in ring.read(3)] == [0, 1, 2]
        assert ring.write_many(msgs[8:]) == 3
        want = [(i, -i, L.request_meta(i, i), payload_for(i, 20)) for i in range(3, 11)]
        assert ring.read() == want


@pytest.mark.parametrize("start", [0, (1 << 62) - 37])
def test_counters_are_free_running(start: int) -> None:
    rng = random.Random(start)
    with local_ring(64, 8, start) as ring:
        used = 0
        for i in range(300):
            length = rng.randrange(0, 3 * 64)
            before = tail_of(ring)
            assert ring.try_write(i, payload_for(i, length))
            used += tail_of(ring) - before
            assert ring.read() == [(i, 0, 0, payload_for(i, length))]
        assert used >= 300 and tail_of(ring) == start + used
        assert ring._words[L.HEAD_OFFSET // 8] == tail_of(ring)  # far past slot_count


# -- the batch an answer came from, in the response record's aux word (tracing) -----------------
@given(
    rows=st.integers(0, 10_000),
    length=st.integers(0, 10_000),
    start_ns=st.integers(1_000, 1 << 62),
    age_ns=st.integers(0, 3_600 * 10**9),
)
@example(rows=4095, length=4095, start_ns=((1 << 40) - 1) * 1000, age_ns=2000)  # the sign bit
@example(rows=1, length=16, start_ns=(1 << 40) * 1000 - 500, age_ns=1000)  # the clock wraps
def test_the_batch_word_round_trips(rows: int, length: int, start_ns: int, age_ns: int) -> None:
    word = L.pack_batch(rows, length, start_ns)
    assert -(1 << 63) <= word < 1 << 63  # the record's signed aux field holds it
    got_rows, got_length, got_start = L.unpack_batch(word, start_ns + age_ns)
    assert (got_rows, got_length) == (min(rows, 4095), min(length, 4095))
    assert got_start == start_ns // 1000 * 1000  # microseconds, whatever the uptime


def test_the_batch_word_crosses_a_real_ring_with_a_two_label_answer_in_one_slot() -> None:
    """The batch rides in aux, which was unused for answers: a two-label answer still takes
    one 64-byte slot, and the word comes back whole, even with its sign bit set."""
    head = L.pack_response(L.STATUS_OK, 0, 1, 2, queued_us=5, model_us=7)
    payload = head + bytes(8)
    assert L.slots_for(len(payload), L.RESPONSE_SLOT_SIZE) == 1
    start = ((1 << 40) - 3) * 1000
    word = L.pack_batch(3000, 128, start)  # rows past 2047 set the sign bit
    assert word < 0
    with local_ring(L.RESPONSE_SLOT_SIZE, 8) as ring:
        assert ring.write_many([(7, payload, word, 0), (8, payload, 0, 0)]) == 2
        assert tail_of(ring) == 2
        (_, aux, _, got), (_, no_batch, _, _) = ring.read()
    assert got == payload and no_batch == 0
    assert L.unpack_batch(aux, start + 10**6) == (3000, 128, start)
    assert L.unpack_batch(0, start) == (0, 0, 0)
