"""A worker's many models, without a model: the fair turn-taking among their batchers (on a
fake clock), a request's meta word (options and model), and the control block's word per model."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock, model_rss
from ringserve.shm.segment import Segment, segment_name
from ringserve.workers.batches import Item
from ringserve.workers.process.batcher import Batcher
from ringserve.workers.process.served import (
    LIGHT_FIRST_RUNS,
    LIGHT_KEEP_RATIO,
    LIGHT_RATIO,
    SHORT_SHARE,
    Turns,
)

MS = 1_000_000
DELAY_NS = 5 * MS
BATCH_COST_NS = 20 * MS  # what one batch takes on the fake clock


def batcher() -> Batcher:
    return Batcher(32, 512, DELAY_NS)


def flood(b: Batcher, n: int, first_id: int, arrived_ns: int = 0) -> None:
    for i in range(n):
        b.add(Item(first_id + i, 0, arrived_ns, [7] * (8 + i % 24)))


def run(turns: Turns, now: int, until: int) -> list[tuple[int, int, list[int]]]:
    """Drive the worker's loop on a fake clock: (model, start ns, msg ids) per batch run."""
    ran = []
    while now < until:
        index, wait = turns.next(now)
        if index is None:
            if wait < 0:
                break
            now += wait
            continue
        batch, _ = turns.batchers[index].take()
        ran.append((index, now, [it.msg_id for it in batch]))
        now += BATCH_COST_NS
    return ran


@pytest.mark.parametrize("b_arrives_ms", [0, 1, 7, 33, 150])
def test_a_flood_on_one_model_delays_another_s_due_batch_by_at_most_one_batch(
    b_arrives_ms: int,
) -> None:
    a, b = batcher(), batcher()
    flood(a, 3000, 0)
    turns = Turns({0: a, 5: b})
    arrival = b_arrives_ms * MS
    ran = run(turns, 0, arrival)  # A alone until B's text comes
    assert {index for index, _, _ in ran} <= {0}
    now = ran[-1][1] + BATCH_COST_NS if ran else 0
    b.add(Item(99_999, 0, arrival, [7] * 12))
    ran = run(turns, max(now, arrival), 10**12)
    at = next(i for i, (index, _, _) in enumerate(ran) if index == 5)
    due = arrival + DELAY_NS
    # Batches of A that started once B's batch was due, before it ran: at most one.
    late = [r for r in ran[:at] if r[1] >= due]
    assert len(late) <= 1, late
    assert ran[at][2] == [99_999]
    # ... and A is not starved in turn: everything of A still runs, once each.
    a_ids = [m for index, _, ids in ran if index == 0 for m in ids]
    assert len(a_ids) == len(set(a_ids)) and not a.size


def test_three_models_take_turns_and_a_lone_text_waits_one_batch_of_each_other() -> None:
    a, b, c = batcher(), batcher(), batcher()
    flood(a, 500, 0)
    flood(c, 500, 10_000)
    b.add(Item(99_999, 0, 3 * MS, [7] * 12))
    ran = run(Turns({1: a, 2: b, 3: c}), 0, 10**12)
    order = [index for index, _, _ in ran]
    at = order.index(2)
    due_from = next(i for i, (_, start, _) in enumerate(ran) if start >= 3 * MS + DELAY_NS)
    assert at - due_from <= 2  # one batch each of A and C at most
    busy = [i for i in order if i != 2]
    # While both floods wait, they alternate: neither runs twice while the other waits.
    both = min(len(busy) - busy[::-1].index(k) for k in (1, 3))
    assert both > 20
    assert all(x != y for x, y in itertools.pairwise(busy[:both]))


def test_turns_wait_for_the_earliest_due_batch_and_idle_when_nothing_waits() -> None:
    a, b = batcher(), batcher()
    turns = Turns({0: a, 1: b})
    assert turns.next(0) == (None, -1)
    a.add(Item(1, 0, 2 * MS, [7] * 10))
    b.add(Item(2, 0, 1 * MS, [7] * 10))
    assert turns.next(2 * MS) == (None, 4 * MS)  # B's, due at 6 ms, is the earliest
    assert turns.next(6 * MS) == (1, 0)
    assert b.take()[0][0].msg_id == 2
    assert turns.next(6 * MS) == (None, 1 * MS)
    assert turns.next(7 * MS) == (0, 0)


def test_one_model_turns_are_its_batcher_s_own_choices() -> None:
    alone, paired = batcher(), batcher()
    flood(alone, 100, 0)
    flood(paired, 100, 0)
    ran = run(Turns({0: paired}), 0, 10**12)
    expected = []
    while alone.size:
        expected.append([it.msg_id for it in alone.take()[0]])
    assert [ids for _, _, ids in ran] == expected


def run_costed(turns: Turns, arrivals: list[tuple[int, int, Item]], until: int) -> dict[int, int]:
    """The worker's loop on a fake clock where a batch costs what its padded tokens would (2.65
    ms + 0.2 ms a token, MiniLM on one core), with `arrivals` (ns, model, item) added as the
    clock passes them: each text's wait, arrival to the start of its batch, by msg id."""
    now, k, waits = 0, 0, {}
    while now < until:
        while k < len(arrivals) and arrivals[k][0] <= now:
            _, index, item = arrivals[k]
            turns.batchers[index].add(item)
            k += 1
        index, wait = turns.next(now)
        if index is None:
            if k == len(arrivals) and wait < 0:
                break
            nxt = arrivals[k][0] if k < len(arrivals) else now + wait
            now = max(now + 1, min(nxt, now + wait) if wait >= 0 else nxt)
            continue
        batch, length = turns.batchers[index].take()
        for it in batch:
            waits[it.msg_id] = now - it.arrived_ns
        now += int(2.65 * MS + 0.2 * MS * len(batch) * length)
    return waits


def light_and_flood(flood_n: int, light_every_ms: int, light_n: int) -> list[tuple[int, int, Item]]:
    """A flood of model 0 at time 0 and a text of model 1 every `light_every_ms` after 3 ms."""
    out = [(0, 0, Item(i, 0, 0, [7] * (16 + i % 16))) for i in range(flood_n)]
    for j in range(light_n):
        t = 3 * MS + j * light_every_ms * MS
        out.append((t, 1, Item(100_000 + j, 0, t, [7] * 20)))
    return sorted(out, key=lambda a: a[0])


def test_a_lighter_model_s_text_waits_behind_a_short_batch_of_the_flooded_one() -> None:
    a, b = Batcher(64, 512, 0), Batcher(64, 512, 0)
    arrivals = light_and_flood(2000, 25, 40)
    waits = run_costed(Turns({0: a, 1: b}), arrivals, 10**12)
    full = 2.65 * MS + 0.2 * MS * 512  # a whole batch of the flood: about 105 ms
    short = 2.65 * MS + 0.2 * MS * 512 // SHORT_SHARE  # its short batch: about 15 ms
    light = {item.msg_id: t for t, index, item in arrivals if index == 1}
    assert set(light) <= set(waits)
    # The first light text comes while a whole batch runs (the worker had seen no other model):
    # it, and those that come before that batch ends, wait for it. Every later one waits behind
    # at most one short batch of the flood (and the light batch running when it came: turns).
    seen = full  # the first flood batch (from 0) ends: the worker sees the first light text
    assert max(waits[m] for m in light) <= full
    later = [waits[m] for m, t in light.items() if t > seen]
    own = 2.65 * MS + 0.2 * MS * 20
    assert len(later) >= 35 and max(later) <= short + own, later
    flood_ids = [m for m in waits if m < 100_000]
    assert len(flood_ids) == 2000 and not a.size  # the flood is not starved


def test_the_flood_s_batches_are_whole_again_once_the_lighter_model_goes_quiet() -> None:
    a, b = Batcher(64, 512, 0), Batcher(64, 512, 0)
    turns = Turns({0: a, 1: b})
    for i in range(400):
        a.add(Item(i, 0, 0, [7] * 32))
    b.add(Item(9_999, 0, 0, [7] * 20))
    turns.next(1 * MS)
    # 400 texts of recent work against 1
    assert (a.cap_tokens, b.cap_tokens) == (512 // SHORT_SHARE, 0)
    turns.next(2 * 10**9)  # B's last text is 2 s old: no one is owed short batches now
    assert (a.cap_tokens, b.cap_tokens) == (0, 0)
    assert a.take()[0] and len(a.take()[0]) == 16  # 512 tokens of 32


def texts(b: Batcher, n: int, first_id: int) -> None:
    for i in range(n):
        b.add(Item(first_id + i, 0, 0, [7] * 20))


def test_a_cap_is_kept_while_the_busier_model_has_the_keep_ratio_of_the_work() -> None:
    """Hysteresis: on a home worker the busy model's share of texts falls as its short batches
    slow the worker down; a cap set at LIGHT_RATIO stays until the ratio is under
    LIGHT_KEEP_RATIO, where a worker that had no cap sets none."""
    assert 1 < LIGHT_KEEP_RATIO < LIGHT_RATIO
    a, b = Batcher(64, 512, 0), Batcher(64, 512, 0)
    turns = Turns({0: a, 1: b})
    texts(a, 41, 0)
    texts(b, 20, 1_000)
    turns.next(1 * MS)  # 41 against 20: a is owed short batches
    assert (a.cap_tokens, b.cap_tokens) == (512 // SHORT_SHARE, 0)
    texts(b, 10, 2_000)  # 41 against 30: under LIGHT_RATIO, over LIGHT_KEEP_RATIO
    turns.next(1 * MS)
    assert (a.cap_tokens, b.cap_tokens) == (512 // SHORT_SHARE, 0)
    fresh_a, fresh_b = Batcher(64, 512, 0), Batcher(64, 512, 0)
    texts(fresh_a, 41, 0)
    texts(fresh_b, 30, 1_000)
    Turns({0: fresh_a, 1: fresh_b}).next(1 * MS)  # the same work, no cap before: none
    assert (fresh_a.cap_tokens, fresh_b.cap_tokens) == (0, 0)
    texts(b, 4, 3_000)  # 41 against 34: under LIGHT_KEEP_RATIO
    turns.next(1 * MS)
    assert (a.cap_tokens, b.cap_tokens) == (0, 0)


def test_behind_a_busy_model_s_whole_batch_a_light_text_is_chosen_at_once() -> None:
    """Turns(behind=True), as CPU workers of many models run: the model owed to a lighter one
    keeps whole batches, which the worker runs on its background thread; while one runs there
    (`held`), the lighter model's text is chosen the moment it is due, and the busy model's
    next batch only once the one behind is done."""
    a, b = Batcher(64, 512, 0), Batcher(64, 512, 0)
    turns = Turns({0: a, 1: b}, behind=True)
    texts(a, 400, 0)
    b.add(Item(9_999, 0, 0, [7] * 20))
    assert turns.next(1 * MS) == (1, 0)  # the lighter model's due text first
    assert [it.msg_id for it in b.take()[0]] == [9_999]
    assert turns.owes(0) and not turns.owes(1)
    assert turns.next(1 * MS) == (0, 0)
    assert (a.cap_tokens, b.cap_tokens) == (0, 0)
    assert len(a.take()[0]) > 512 // SHORT_SHARE // 20  # more rows than an eighth holds
    b.add(Item(10_000, 0, 5 * MS, [7] * 20))  # comes while that batch runs behind
    assert turns.next(5 * MS, held=True) == (1, 0)
    assert [it.msg_id for it in b.take()[0]] == [10_000]
    assert turns.next(6 * MS, held=True) == (None, -1)  # the flood waits for its batch behind
    assert turns.next(6 * MS) == (0, 0)
    assert not Turns({0: a, 1: b}).owes(0)  # without behind, owed models are capped instead


def test_two_equally_busy_models_keep_whole_batches() -> None:
    a, b = Batcher(64, 512, 0), Batcher(64, 512, 0)
    for i in range(300):
        a.add(Item(i, 0, i * MS, [7] * 32))
        b.add(Item(10_000 + i, 0, i * MS, [7] * 32))
    turns = Turns({0: a, 1: b})
    turns.next(300 * MS)
    assert (a.cap_tokens, b.cap_tokens) == (0, 0)


# -- a request's meta word: its options and its model, beside the text --------------------------
@given(index=st.integers(0, L.MAX_MODELS - 1), opts=st.integers(0, 0xFF))
def test_the_meta_word_round_trips_the_options_and_the_model(index: int, opts: int) -> None:
    meta = L.request_meta(opts, index)
    assert 0 <= meta < 1 << 32  # the record's u32 word holds it
    assert L.split_meta(meta) == (opts, index)


def test_the_first_model_without_options_is_meta_zero() -> None:
    assert L.request_meta(0, 0) == 0 and L.split_meta(0) == (0, 0)
    assert L.request_meta(L.OPT_EMBED | L.OPT_BULK, 3) == (3 << 16) | 24


# -- the control block's word per model -----------------------------------------------------------
def test_model_rss_has_one_word_per_index_apart_from_every_counter() -> None:
    seg = Segment.create(segment_name(os.getpid(), 980_001, "ctl"), L.CONTROL_BYTES)
    try:
        ctl = ControlBlock(seg, create=True)
        ctl.beat()
        ctl.count_batch(3)
        before = ctl.snapshot(), ctl.batch_histogram(), ctl.get("magic")
        stamp = ctl.words[L.CTL_HEARTBEAT]
        for i in range(L.MAX_MODELS):
            ctl.set_model_rss(i, (i + 1) * 4096)
        assert (ctl.snapshot(), ctl.batch_histogram(), ctl.get("magic")) == before
        assert ctl.words[L.CTL_HEARTBEAT] == stamp
        assert [model_rss(ctl, i) for i in range(L.MAX_MODELS)] == [
            (i + 1) * 4096 for i in range(L.MAX_MODELS)
        ]
        for bad in (-1, L.MAX_MODELS):
            with pytest.raises(ValueError, match="model index"):
                ctl.set_model_rss(bad, 1)
            with pytest.raises(ValueError, match="model index"):
                model_rss(ctl, bad)
        ctl.close()
    finally:
        seg.close()
        seg.unlink()


def test_a_lighter_model_s_text_that_came_during_its_own_batch_runs_before_the_flood_s() -> None:
    a, b = Batcher(64, 512, 0), Batcher(64, 512, 0)
    turns = Turns({0: a, 1: b})
    flood(a, 400, 0)
    b.add(Item(90_000, 0, 0, [7] * 20))
    index, _ = turns.next(1 * MS)
    assert index == 1 and [it.msg_id for it in b.take()[0]] == [90_000]
    b.add(Item(90_001, 0, 2 * MS, [7] * 20))  # came while the light model's batch ran
    index, _ = turns.next(8 * MS)
    assert index == 1 and [it.msg_id for it in b.take()[0]] == [90_001]  # not behind A's
    index, _ = turns.next(15 * MS)
    assert index == 0 and a.cap_tokens == 512 // SHORT_SHARE  # then the flood, in a short batch


def test_the_busier_model_runs_after_at_most_light_first_runs_lighter_batches() -> None:
    a, b = Batcher(64, 512, 0), Batcher(4, 512, 0)  # B: 4 texts a batch, 25 batches due
    turns = Turns({0: a, 1: b})
    flood(a, 400, 0)
    flood(b, 100, 10_000)
    ran = [index for index, _, _ in run(turns, 1 * MS, 40 * BATCH_COST_NS)]  # within B's second
    assert ran[:LIGHT_FIRST_RUNS] == [1] * LIGHT_FIRST_RUNS and ran.count(1) == 25
    streaks = [len(list(g)) for k, g in itertools.groupby(ran) if k == 1]
    assert max(streaks) <= LIGHT_FIRST_RUNS
    while_b = ran[: len(ran) - ran[::-1].index(1)]  # until B's last batch
    assert all(len(list(g)) == 1 for k, g in itertools.groupby(while_b) if k == 0)
