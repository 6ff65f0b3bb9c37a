"""The batcher's choices, on a fake clock: which texts run together, padded to what, in what
order, when a batch runs, and what happens to texts whose deadline passed."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ringserve.workers.batches import Item, row_limit
from ringserve.workers.process.batcher import (
    CUDA_BUCKETS,
    Batcher,
    batch_limits,
    bucket_index,
    cheapest_split,
    default_grid,
    length_grid,
    pad_grid,
    runs,
)

MS = 1_000_000


def item(msg_id: int, length: int, arrived_ns: int = 0, deadline_ns: int = 0) -> Item:
    return Item(msg_id, deadline_ns, arrived_ns, [7] * length)


def ids(batch: list[Item]) -> list[int]:
    return sorted(it.msg_id for it in batch)


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(0, 0), (1, 0), (64, 0), (65, 1), (128, 1), (129, 2), (256, 2), (10_000, 2)],
)
def test_bucket_index(length: int, bucket: int) -> None:
    assert bucket_index((64, 128, 256), length) == bucket


def test_grids() -> None:
    assert length_grid((64, 128, 256, 512), 256) == (64, 128, 256)
    assert length_grid((16, 32), 256) == (16, 32, 256)  # the model's max length ends it
    assert pad_grid((), False, 256) == ()  # CPU default: no grid
    assert pad_grid((), True, 128) == (16, 32, 48, 64, 96, 128)  # CUDA default
    assert pad_grid((64,), False, 256) == (64, 256)  # opt-in on the CPU
    assert CUDA_BUCKETS == (16, 32, 48, 64, 96, 128, 192, 256)
    assert pad_grid((), True, 256) == CUDA_BUCKETS  # the default model's grid as it was
    # OpenVINO's CPU default: a grid, so that few shapes get kernels built (batcher.py says why)
    assert pad_grid((), False, 256, "openvino") == (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    assert pad_grid((), False, 100, "openvino") == (8, 16, 24, 32, 48, 64, 96, 100)
    assert pad_grid((), False, 512, "openvino")[-3:] == (256, 384, 512)  # on past 256
    assert pad_grid((), False, 256, "onnx") == ()  # ONNX Runtime: none, as before
    assert pad_grid((64,), False, 256, "openvino") == (64, 256)  # --buckets wins


def test_a_long_models_default_grid_goes_on_past_256() -> None:
    """ModernBERT's 8,192: a text of 300 tokens is padded to 384, not to 8,192, on a GPU; its
    latency is reported in the same classes on the CPU; and the GPU's graphs stay in bounds."""
    grid = pad_grid((), True, 8192)
    assert grid == (*CUDA_BUCKETS, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
    assert grid[bucket_index(grid, 300)] == 384
    assert all(b / a <= 1.5 for a, b in itertools.pairwise(grid[7:]))
    assert default_grid(8192) == grid and default_grid(512)[-3:] == (256, 384, 512)
    assert default_grid(514)[-2:] == (512, 514)  # the model's max length always ends it
    assert pad_grid((), False, 8192) == ()  # the CPU still pads a batch to its own longest
    from ringserve.service.config.settings import GPU_MAX_BATCH, GPU_MAX_BATCH_TOKENS
    from ringserve.workers.runtimes.cuda import MAX_GRAPHS, gpu_batch_limits, shape_sizes

    limits = gpu_batch_limits(grid, GPU_MAX_BATCH, GPU_MAX_BATCH_TOKENS)
    assert sum(map(len, shape_sizes(limits, grid, GPU_MAX_BATCH))) <= MAX_GRAPHS


@pytest.mark.parametrize(
    ("length", "max_batch", "max_tokens", "rows"),
    [(16, 32, 512, 32), (13, 64, 512, 39), (100, 32, 512, 5), (600, 32, 512, 1), (0, 4, 9, 4)],
)
def test_row_limit(length: int, max_batch: int, max_tokens: int, rows: int) -> None:
    assert row_limit(length, max_batch, max_tokens) == rows


def test_cuda_batch_limits_keep_a_constant_budget() -> None:
    assert batch_limits((64, 128, 256), 32) == [32, 16, 8]
    assert batch_limits((16, 512), 4) == [4, 1]


def test_a_batch_is_padded_to_its_own_longest_text() -> None:
    b = Batcher(32, 512, 0)
    for n, length in enumerate([9, 12, 11, 10]):
        b.add(item(n, length))
    batch, length = b.take()
    assert ids(batch) == [0, 1, 2, 3] and length == 12
    assert b.size == 0 and b.take() == ([], 0) and b.wait_ns(0) == -1


def test_an_opt_in_grid_rounds_the_longest_up() -> None:
    b = Batcher(32, 4096, 0, grid=(16, 32, 256))
    for n, length in enumerate([9, 17, 12, 20, 30]):
        b.add(item(n, length))
    batch, length = b.take()
    assert ids(batch) == [0, 1, 2, 3, 4] and length == 32


def test_texts_of_similar_length_go_together_under_the_budget() -> None:
    b = Batcher(32, 512, 0, overhead_tokens=32)
    lengths = [10, 100, 11, 101, 12, 102, 9, 103, 104, 105, 106]
    for n, length in enumerate(lengths):
        b.add(item(n, length))
    first, length = b.take()  # the oldest is short: the short ones come with it
    assert ids(first) == [0, 2, 4, 6] and length == 12
    # The 7 long ones need two batches (4 rows of 103 fit in 512, 5 of 104 do not). Splitting
    # 3 + 4 or 4 + 3 costs the same padding; the first cheapest split found is kept.
    second, length = b.take()
    assert ids(second) == [1, 3, 5] and length == 102
    third, length = b.take()
    assert ids(third) == [7, 8, 9, 10] and length == 106


@pytest.mark.parametrize(
    ("short", "together"),
    [
        # 2 x 4 tokens of padding cost less than a batch's fixed cost (11): they join.
        (26, True),
        # 2 x 17 tokens of padding cost more: the short ones run alone.
        (13, False),
    ],
)
def test_shorter_texts_join_a_batch_only_when_their_padding_costs_less_than_a_batch(
    short: int, together: bool
) -> None:
    b = Batcher(32, 512, 0, overhead_tokens=11)
    b.add(item(0, short))
    b.add(item(1, short + 1))
    for n in range(2, 12):
        b.add(item(n, 30))
    batch, length = b.take()
    if together:
        assert ids(batch) == list(range(12)) and length == 30
    else:
        assert ids(batch) == [0, 1] and length == short + 1


def split_cost(lengths: list[int], bounds: list[tuple[int, int]], overhead: int) -> int:
    return sum(overhead + (end - start) * lengths[end - 1] for start, end in bounds)


def all_splits(n: int) -> list[list[tuple[int, int]]]:
    """Every way to cut range(n) into contiguous runs."""
    if n == 0:
        return [[]]
    out = []
    for start in range(n):
        for rest in all_splits(start):
            out.append([*rest, (start, n)])
    return out


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 120), min_size=1, max_size=9),
    max_batch=st.integers(1, 6),
    max_tokens=st.sampled_from([64, 128, 512]),
    overhead=st.sampled_from([0, 4, 11, 32, 200]),
)
def test_the_split_is_the_cheapest_within_the_limits(
    lengths: list[int], max_batch: int, max_tokens: int, overhead: int
) -> None:
    lengths.sort()
    got = runs(cheapest_split(lengths, max_batch, max_tokens, overhead))
    assert [i for run in got for i in range(*run)] == list(range(len(lengths)))

    def allowed(run: tuple[int, int]) -> bool:
        return run[1] - run[0] <= row_limit(lengths[run[1] - 1], max_batch, max_tokens)

    assert all(allowed(r) for r in got)
    best = min(
        split_cost(lengths, split, overhead)
        for split in all_splits(len(lengths))
        if all(allowed(r) for r in split)
    )
    assert split_cost(lengths, got, overhead) == best


def test_a_text_longer_than_the_budget_runs_alone() -> None:
    b = Batcher(32, 64, 0)
    b.add(item(0, 200))
    b.add(item(1, 200))
    assert [ids(b.take()[0]) for _ in range(2)] == [[0], [1]]


def test_a_long_text_is_not_starved_by_a_stream_of_short_ones() -> None:
    b = Batcher(8, 512, 0)
    for n in range(20):
        b.add(item(n, 10))
    b.add(item(99, 250))
    batches = 0
    while True:
        for n in range(8):  # more short texts arrive than each batch takes
            b.add(item(1000 + batches * 8 + n, 10))
        batch, _ = b.take()
        batches += 1
        if 99 in ids(batch):
            break
    assert batches == 4  # the 20 before it, 8 a batch, then it: its wait is bounded


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.lists(st.integers(1, 256), max_size=12), min_size=1, max_size=20),
    max_batch=st.integers(1, 16),
    max_tokens=st.sampled_from([64, 256, 512, 2048]),
    grid=st.sampled_from([(), (16, 32, 64, 128, 256), (64, 256)]),
)
def test_every_batch_holds_the_oldest_and_fits_the_limits(
    steps: list[list[int]], max_batch: int, max_tokens: int, grid: tuple[int, ...]
) -> None:
    b = Batcher(max_batch, max_tokens, 0, grid)
    waiting: dict[int, int] = {}  # msg id (= arrival order) -> length
    taken: list[int] = []
    n = 0
    for arrivals in [*steps, *[[]] * 400]:
        for length in arrivals:
            b.add(item(n, length))
            waiting[n] = length
            n += 1
        batch, padded = b.take()
        if not batch:
            assert not waiting
            continue
        got = ids(batch)
        assert got[0] == min(waiting)  # the oldest text is always in the next batch
        longest = max(waiting[m] for m in got)
        assert padded == (grid[bucket_index(grid, longest)] if grid else longest)
        assert len(batch) <= max_batch
        assert len(batch) == 1 or len(batch) * padded <= max_tokens
        for m in got:
            del waiting[m]
        taken += got
    assert sorted(taken) == list(range(n)) and b.size == 0


def test_wait_ns_on_a_fake_clock() -> None:
    b = Batcher(4, 512, 5 * MS)
    assert b.wait_ns(0) == -1  # nothing queued: sleep until a request comes
    b.add(item(1, 10, arrived_ns=1000))
    assert b.wait_ns(1000) == 5 * MS
    assert b.wait_ns(1000 + 4 * MS) == MS
    assert b.wait_ns(1000 + 5 * MS) == 0
    assert b.wait_ns(1000 + 60 * MS) == 0  # late: run now, never negative
    for n in range(2, 5):
        b.add(item(n, 10, arrived_ns=2000))
    assert b.wait_ns(1000) == 0  # a full batch runs at once


def test_a_batch_full_by_tokens_runs_at_once() -> None:
    b = Batcher(32, 256, 5 * MS)
    b.add(item(1, 100, arrived_ns=0))
    assert b.wait_ns(0) == 5 * MS
    b.add(item(2, 100, arrived_ns=0))  # 2 x 100 of 256: a third would not fit
    assert b.wait_ns(0) == 0


def test_no_delay_means_run_at_once() -> None:
    b = Batcher(32, 512, 0)
    b.add(item(1, 10, arrived_ns=50))
    assert b.wait_ns(0) == 0


def test_expired_texts_are_removed_and_never_run() -> None:
    b = Batcher(32, 512, 0)
    b.add(item(0, 10, deadline_ns=5 * MS))
    b.add(item(1, 10, deadline_ns=0))  # no deadline
    b.add(item(2, 11, deadline_ns=20 * MS))
    b.add(item(3, 200, deadline_ns=5 * MS))
    assert b.expire(4 * MS) == [] and b.size == 4
    assert ids(b.expire(5 * MS)) == [0, 3]  # a deadline at `now` has passed
    assert b.size == 2 and b.next_expiry == 20 * MS
    batch, length = b.take()  # the oldest left is 1: expired texts left no trace
    assert ids(batch) == [1, 2] and length == 11
    assert b.expire(60 * MS) == [] and b.size == 0


def test_expire_is_cheap_when_nothing_can_have_expired() -> None:
    b = Batcher(32, 512, 0)
    b.add(item(0, 10, deadline_ns=9 * MS))
    b.by_length[0][2].deadline_ns = 1  # not seen: the bound says nothing is due before 9 ms
    assert b.expire(5 * MS) == []


def test_drain_all() -> None:
    b = Batcher(4, 512, MS)
    for n, length in enumerate([10, 200, 100, 20]):
        b.add(item(n, length))
    b.take()
    assert ids(b.drain_all()) == [1, 2]
    assert b.size == 0 and b.take() == ([], 0) and b.wait_ns(0) == -1


# -- priority (shm.layout.OPT_BULK) -------------------------------------------------------------
def bulk_item(msg_id: int, length: int, arrived_ns: int) -> Item:
    return Item(msg_id, 0, arrived_ns, [7] * length, bulk=True)


def test_an_interactive_text_runs_before_older_bulk_texts_in_a_batch_of_its_own() -> None:
    b = Batcher(64, 512, 0)
    for n in range(17):
        b.add(bulk_item(n, 30, arrived_ns=n * MS))
    batch, _ = b.take()  # bulk alone: a whole batch (512 // 30 = 17 rows)
    assert len(batch) == 17 and all(it.bulk for it in batch)
    for n in range(17, 40):
        b.add(bulk_item(n, 30, arrived_ns=n * MS))
    b.add(item(100, 30, arrived_ns=50 * MS))
    b.add(item(101, 31, arrived_ns=50 * MS))
    batch, _ = b.take()
    # The interactive texts go next, ahead of 23 older bulk texts, and no bulk text joins them.
    assert ids(batch) == [100, 101]
    batch, _ = b.take()
    assert all(it.bulk for it in batch)
    assert len(batch) * 30 <= 512 // 16  # bulk batches are a sixteenth while interactive is recent
    b.add(item(102, 30, arrived_ns=60 * MS))
    assert ids(b.take()[0]) == [102]  # behind one such short batch
    while b.size:
        assert len(b.take()[0]) * 30 <= 512 // 16
    for n in range(200, 217):  # two seconds on: no interactive text for the last one
        b.add(bulk_item(n, 30, arrived_ns=(2000 + n) * MS))
    batch, _ = b.take()
    assert len(batch) == 17  # whole bulk batches again


def test_an_overdue_bulk_text_runs_with_bulk_texts_only() -> None:
    b = Batcher(64, 512, 0)
    b.bulk_wait_ns = 100 * MS
    b.add(bulk_item(0, 10, arrived_ns=0))
    b.add(bulk_item(1, 10, arrived_ns=0))
    b.add(item(10, 10, arrived_ns=150 * MS))
    b.add(item(11, 10, arrived_ns=150 * MS))
    assert ids(b.take()[0]) == [0, 1]  # overdue: first, and without the interactive texts
    assert ids(b.take()[0]) == [10, 11]


def test_expire_and_drain_see_both_classes() -> None:
    b = Batcher(64, 512, 0)
    b.add(Item(1, 5 * MS, 0, [7] * 10, bulk=True))
    b.add(item(2, 10, deadline_ns=6 * MS))
    b.add(bulk_item(3, 10, arrived_ns=0))
    b.add(item(4, 10))
    assert ids(b.expire(7 * MS)) == [1, 2] and b.size == 2
    assert ids(b.drain_all()) == [3, 4] and b.size == 0 and b.take() == ([], 0)


def test_a_bulk_text_in_a_worker_waits_behind_interactive_ones_at_most_its_bound() -> None:
    b = Batcher(1, 512, 0)  # one row a batch: every take runs one text
    b.bulk_wait_ns = 100 * MS
    b.add(bulk_item(0, 10, arrived_ns=0))
    taken_at = None
    for step in range(1, 40):  # two interactive texts every 10 ms, one taken
        now = step * 10 * MS
        b.add(item(2 * step, 10, arrived_ns=now))
        b.add(item(2 * step + 1, 10, arrived_ns=now))
        if b.take()[0][0].msg_id == 0:
            taken_at = now
            break
    assert taken_at == 100 * MS  # not before its bound, and not after
