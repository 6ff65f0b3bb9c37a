"""The batcher's choices: which bucket a text falls in, batch sizes, and which batch runs next."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.batcher import Batcher, Item, batch_limits, bucket_index

BUCKETS = (64, 128, 256)
MS = 1_000_000


def item(msg_id: int, length: int, arrived_ns: int) -> Item:
    return Item(msg_id, 0, arrived_ns, [7] * length)


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(0, 0), (1, 0), (64, 0), (65, 1), (128, 1), (129, 2), (256, 2), (10_000, 2)],
)
def test_bucket_index(length: int, bucket: int) -> None:
    assert bucket_index(BUCKETS, length) == bucket


def test_bucket_index_single_bucket() -> None:
    assert [bucket_index((32,), n) for n in (0, 32, 33)] == [0, 0, 0]


@pytest.mark.parametrize(
    ("buckets", "max_batch", "limits"),
    [
        (BUCKETS, 32, [32, 16, 8]),  # a constant token budget of 32 x 64
        (BUCKETS, 1, [1, 1, 1]),
        ((64,), 8, [8]),
        ((16, 512), 4, [4, 1]),  # never below one row
        ((100, 150), 10, [10, 6]),
    ],
)
def test_batch_limits(buckets: tuple[int, ...], max_batch: int, limits: list[int]) -> None:
    assert batch_limits(buckets, max_batch) == limits


def test_oldest_bucket_first_fifo_within() -> None:
    b = Batcher(BUCKETS, 32, 5 * MS)
    for msg_id, length, t in [(1, 100, 1), (2, 10, 2), (3, 200, 3), (4, 120, 4), (5, 20, 5)]:
        b.add(item(msg_id, length, t))
    assert b.size == 5
    order = []
    while (i := b.next_bucket()) is not None:
        order.append((i, [it.msg_id for it in b.take(i)]))
    assert order == [(1, [1, 4]), (0, [2, 5]), (2, [3])]
    assert b.size == 0 and b.wait_ns(10) == -1


def test_take_respects_the_bucket_limit() -> None:
    b = Batcher(BUCKETS, 4, 5 * MS)  # limits 4, 2, 1
    for n in range(7):
        b.add(item(n, 200, n))
    assert [[it.msg_id for it in b.take(2)] for _ in range(3)] == [[0], [1], [2]]
    assert b.size == 4 and b.next_bucket() == 2


def test_wait_ns() -> None:
    b = Batcher(BUCKETS, 4, 5 * MS)
    assert b.wait_ns(0) == -1  # nothing queued: sleep until a request comes
    b.add(item(1, 10, 1000))
    assert b.wait_ns(1000) == 5 * MS
    assert b.wait_ns(1000 + 4 * MS) == MS
    assert b.wait_ns(1000 + 5 * MS) == 0
    assert b.wait_ns(1000 + 60 * MS) == 0  # late: run now, never negative
    for n in range(2, 5):
        b.add(item(n, 10, 2000))
    assert b.wait_ns(1000) == 0  # a full batch runs at once


def test_drain_all() -> None:
    b = Batcher(BUCKETS, 4, MS)
    for n, length in enumerate([10, 200, 100, 20]):
        b.add(item(n, length, n))
    assert sorted(it.msg_id for it in b.drain_all()) == [0, 1, 2, 3]
    assert b.size == 0 and b.next_bucket() is None


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), max_size=80),
    max_batch=st.integers(1, 8),
)
def test_every_item_once_in_order(lengths: list[int], max_batch: int) -> None:
    """Each batch is one bucket's oldest items, led by the oldest item queued anywhere."""
    b = Batcher(BUCKETS, max_batch, MS)
    for n, length in enumerate(lengths):
        b.add(item(n, length, 100 + n))
    taken: list[int] = []
    while (i := b.next_bucket()) is not None:
        batch = [it.msg_id for it in b.take(i)]
        assert batch[0] == min(set(range(len(lengths))) - set(taken))
        assert 1 <= len(batch) <= b.limits[i]
        assert batch == sorted(batch)
        assert {bucket_index(BUCKETS, lengths[n]) for n in batch} == {i}
        taken += batch
    assert sorted(taken) == list(range(len(lengths))) and b.size == 0


def test_items_read_in_one_pass_keep_their_order_across_buckets() -> None:
    # A pass over the ring stamps every item with the same arrival time; the longer bucket's
    # item came first and must run first (a short text must not overtake it).
    b = Batcher((64, 128, 256), 32, 0)
    b.add(Item(1, 0, 5, [1] * 200))
    b.add(Item(2, 0, 5, [1] * 10))
    assert b.next_bucket() == 2
    assert [it.msg_id for it in b.take(2)] == [1]
    assert b.next_bucket() == 0
