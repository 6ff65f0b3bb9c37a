"""Many models in the front-end, in process on a fake clock: each model's lane (its queue limit,
its waiting lines, flushed round-robin across models), closing a model, waiting for it to be
empty, routing a model's texts only to workers that hold it, and the per-model numbers the
metrics show. The workers are the stand-ins of test_clock; the dispatcher, the admission and the
stats are the production code."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from ringserve.service.engine.admission import Admission, Refusal
from ringserve.service.engine.dispatcher import BULK, Dispatcher, Result
from ringserve.service.engine.requests import Ask
from ringserve.service.ops import stats as S_
from ringserve.service.ops.prometheus import request_rows
from ringserve.service.ops.stats import Stats
from ringserve.shm import layout as L

from devkit.fakes import Calls, Clock, S
from devkit.fakes import RingWorker as Worker

MS = 1_000_000

A, B, C = 0, 1, 2  # model indexes


def models(
    *workers: Worker, max_queue: int = 1000, each: int = 0, names: str = "abc"
) -> tuple[Dispatcher, Clock]:
    """A dispatcher with models a, b and c open (each up to `each` texts; 0: the total)."""
    clock = Clock()
    d = Dispatcher(max_queue, clock)
    for index, name in enumerate(names):
        d.table.open(index, name, each)
    d.serving = list(workers)
    return d, clock


def in_ring(w: Worker) -> list[tuple[int, bytes]]:
    """(model, text) of what the worker's ring holds, in order (the model from the meta word)."""
    return [(L.split_meta(meta)[1], text) for _, text, _, meta in w.ring]


def answer(d: Dispatcher, w: Worker) -> None:
    w.answer()
    d.answers.read(w)


# -- fairness -------------------------------------------------------------------------------------
def test_a_flood_of_one_model_cannot_starve_another_models_waiting_text() -> None:
    """A worker that takes one text at a time; models a and c flood it, then one text of b
    arrives: it reaches the worker within one round (one answer a model), not behind the
    floods; and each model's texts keep their order."""
    w = Worker(room=1, models=frozenset({A, B, C}))
    d, _ = models(w)
    assert d.submit([b"a%d" % i for i in range(200)], 0, Calls(), model=A)
    assert d.submit([b"c%d" % i for i in range(200)], 0, Calls(), model=C)
    assert d.submit([b"b0"], 0, Calls(), model=B)
    seen = in_ring(w)
    for _ in range(3):  # one round: a turn for each of the three models
        answer(d, w)
        seen += in_ring(w)
    assert (B, b"b0") in seen, seen
    a_seen = [t for m, t in seen if m == A]
    assert a_seen == [b"a%d" % i for i in range(len(a_seen))]  # in order within a model


def test_without_a_second_model_the_order_is_the_one_model_order() -> None:
    w = Worker(room=2)
    d, _ = models(w)
    d.submit([b"1", b"2", b"3"], 0, Calls())
    d.submit([b"4"], 0, Calls())
    assert [m[1] for m in w.ring] == [b"1", b"2"]  # model 0's payload carries no mark
    answer(d, w)
    assert [m[1] for m in w.ring] == [b"3", b"4"]


def test_a_model_refused_room_gets_the_next_turn() -> None:
    """Texts taken in a turn but not placed give their model the first turn back: room that
    frees up goes to the model that was refused it."""
    w = Worker(room=1, models=frozenset({A, B}))
    d, _ = models(w)
    d.submit([b"a%d" % i for i in range(300)], 0, Calls(), model=A)  # more than a take
    d.submit([b"b0", b"b1"], 0, Calls(), model=B)
    order = []
    for _ in range(6):
        answer(d, w)
        order += in_ring(w)
    assert order == [(A, b"a1"), (B, b"b0"), (A, b"a2"), (B, b"b1"), (A, b"a3"), (A, b"a4")]


def test_interactive_texts_of_any_model_go_before_bulk_ones() -> None:
    w = Worker(room=1, models=frozenset({A, B}))
    d, clock = models(w)
    d.submit([b"i0"], clock.now + S, Calls(), model=A)  # in the ring
    d.submit([b"bulk"], clock.now + S, Calls(), priority=BULK, model=A)
    d.submit([b"i1"], clock.now + S, Calls(), model=B)
    answer(d, w)
    assert in_ring(w) == [(B, b"i1")]  # b's interactive text before a's older bulk one
    answer(d, w)
    assert in_ring(w) == [(A, b"bulk")] and L.split_meta(w.ring[0][3]) == (L.OPT_BULK, A)


def test_the_model_bulk_and_options_ride_in_the_meta_word_beside_the_text() -> None:
    """The payload is the text as admitted; its model, its priority and its options are the
    record's meta word (shm/layout.py request_meta), one for all texts or one a text."""
    w = Worker(models=frozenset({A, B}))
    d, _ = models(w)
    d.submit([b"x"], 0, Calls(), priority=BULK, model=B, options=L.OPT_CUT)
    d.submit([b"y"], 0, Calls(), model=A)
    d.submit([b"s", b"v"], 0, Calls(), model=A, options=[0, L.OPT_EMBED])
    assert [(m[1], m[3]) for m in w.ring] == [
        (b"x", L.request_meta(L.OPT_CUT | L.OPT_BULK, B)),
        (b"y", 0),
        (b"s", 0),
        (b"v", L.request_meta(L.OPT_EMBED, A)),
    ]


# -- routing --------------------------------------------------------------------------------------
def test_a_models_texts_go_only_to_workers_that_hold_it() -> None:
    only_a, only_b = Worker(models=frozenset({A})), Worker(models=frozenset({B}))
    d, _ = models(only_a, only_b)
    d.submit([b"b%d" % i for i in range(5)], 0, Calls(), model=B)  # only_a is less loaded
    d.submit([b"a0"], 0, Calls(), model=A)
    assert [m for m, _ in in_ring(only_b)] == [B] * 5 and in_ring(only_a) == [(A, b"a0")]
    d.submit([b"c0"], 0, Calls(), model=C)  # no worker holds c yet: it waits
    assert [(r.payload, r.meta) for r in d.waiting] == [(b"c0", L.request_meta(0, C))]


def test_a_full_model_does_not_hold_back_another_models_texts() -> None:
    full, free = Worker(room=0, models=frozenset({A})), Worker(models=frozenset({B}))
    d, _ = models(full, free)
    d.submit([b"a0", b"a1"], 0, Calls(), model=A)  # wait: a's only worker is full
    d.submit([b"b0"], 0, Calls(), model=B)
    assert in_ring(free) == [(B, b"b0")] and len(d.waiting) == 2


def test_a_dead_workers_texts_go_only_to_workers_that_hold_their_model() -> None:
    dead = Worker(models=frozenset({A, B}))
    d, _ = models(dead)
    done = Calls()
    d.submit([b"a0"], 0, done, model=A)
    d.submit([b"b0", b"b1"], 0, done, model=B)
    other_a = Worker(models=frozenset({A}))
    d.serving = [other_a]  # the supervisor swapped the dead one out
    assert d.reroute(dead) == 3
    assert in_ring(other_a) == [(A, b"a0")]  # b's texts wait for a worker holding b
    assert [(L.split_meta(r.meta)[1], r.payload) for r in d.waiting] == [(B, b"b0"), (B, b"b1")]
    other_b = Worker(models=frozenset({B}))
    d.serving.append(other_b)
    d.flush_waiting()
    assert in_ring(other_b) == [(B, b"b0"), (B, b"b1")]
    answer(d, other_a)
    answer(d, other_b)
    assert len(done.results) == 2 and d.depth == 0


def both() -> tuple[Worker, Worker]:
    return Worker(models=frozenset({A, B})), Worker(models=frozenset({A, B}))


def test_a_light_models_texts_go_to_its_home_worker_the_busy_ones_to_both() -> None:
    """Once model a has placed twice b's recent work (routing.Homes), b's texts go only to the
    first serving worker that holds it, though the other holds less; a's still go to both."""
    home, other = both()
    d, clock = models(home, other)
    d.submit([b"a%d" % i for i in range(10)], 0, Calls(), model=A)
    d.submit([b"b0"], 0, Calls(), model=B)  # a alone had work: no home yet
    for i in range(1, 5):
        clock.now += MS
        d.submit([b"b%d" % i], 0, Calls(), model=B)
        d.submit([b"a"], 0, Calls(), model=A)  # as often to each worker
    assert [t for m, t in in_ring(home) if m == B][-4:] == [b"b1", b"b2", b"b3", b"b4"]
    assert [t for m, t in in_ring(other) if m == B] == []
    assert A in {m for m, _ in in_ring(home)} and A in {m for m, _ in in_ring(other)}


def test_a_light_models_first_text_goes_home_too() -> None:
    """A model that has placed nothing beside one that has is light from its first text
    (Homes.unseen): it goes to the home, though the other worker holds less, so no other
    worker's Turns shortens the busy model's batches for one text."""
    home, other = both()
    d, _ = models(home, other)
    d.submit([b"a%d" % i for i in range(11)], 0, Calls(), model=A)  # the home holds one more
    assert sum(m == A for m, _ in in_ring(home)) > sum(m == A for m, _ in in_ring(other))
    d.submit([b"b0"], 0, Calls(), model=B)
    assert (B, b"b0") in in_ring(home) and all(m == A for m, _ in in_ring(other))


def test_a_light_model_whose_home_leaves_goes_to_the_next_worker_and_loses_nothing() -> None:
    home, other = both()
    d, clock = models(home, other)
    done = Calls()
    d.submit([b"a%d" % i for i in range(10)], 0, Calls(), model=A)
    for i in range(3):
        clock.now += MS
        d.submit([b"b%d" % i], 0, done, model=B)
    d.serving = [other]  # the home died: the supervisor swapped it out
    assert [t for m, t in in_ring(home) if m == B][-2:] == [b"b1", b"b2"]
    d.reroute(home)
    d.submit([b"b3"], 0, done, model=B)
    assert [t for m, t in in_ring(other) if m == B] == [b"b0", b"b1", b"b2", b"b3"]
    answer(d, other)
    assert len(done.results) == 4


def test_a_light_model_that_becomes_busy_loses_its_home() -> None:
    home, other = both()
    d, clock = models(home, other)
    d.submit([b"a%d" % i for i in range(10)], 0, Calls(), model=A)
    clock.now += MS
    d.submit([b"b0"], 0, Calls(), model=B)
    clock.now += MS
    d.submit([b"b1"], 0, Calls(), model=B)
    assert (B, b"b1") in in_ring(home)
    d.submit([b"b%d" % i for i in range(2, 42)], 0, Calls(), model=B)  # b is the busy one now
    clock.now += MS
    d.submit([b"a10", b"a11"], 0, Calls(), model=A)  # ... and a the light one
    assert in_ring(home)[-2:] == [(A, b"a10"), (A, b"a11")]
    for i in range(42, 46):
        d.submit([b"b%d" % i], 0, Calls(), model=B)
    b_last = {t for m, t in in_ring(other) if m == B}
    assert b_last & {b"b42", b"b43", b"b44", b"b45"}  # spread again


def test_one_model_has_no_home() -> None:
    w1, w2 = Worker(), Worker()
    d, clock = models(w1, w2, names="a")
    for i in range(6):
        clock.now += MS
        d.submit([b"a%d" % i], 0, Calls(), model=A)
    assert len(w1.ring) == len(w2.ring) == 3


# -- limits ---------------------------------------------------------------------------------------
def admission(d: Dispatcher) -> Admission:
    return Admission(d, lambda: d.why, 30.0)


def submit(a: Admission, text: bytes, model: int, done: Calls | None = None) -> Refusal | None:
    done = done if done is not None else Calls()
    return a.submit(Ask([text], 0, "classify", model, 100 * S), done, None)  # due later


def test_one_models_full_queue_refuses_only_that_models_texts() -> None:
    d, _ = models(Worker(room=0, models=frozenset({A, B})), max_queue=10, each=4)
    a = admission(d)
    for i in range(4):
        assert submit(a, b"a%d" % i, A) is None
    assert submit(a, b"a4", A) == Refusal(503, "queue is full", 1)
    assert submit(a, b"b0", B) is None  # b has its own room
    assert d.lanes[A].rejected == 1 and d.lanes[B].rejected == 0 and d.rejected == 1
    assert d.table.depth(A) == 4 and d.table.depth(B) == 1 and d.depth == 5


def test_the_total_bounds_every_model_together() -> None:
    d, _ = models(Worker(room=0, models=frozenset({A, B})), max_queue=8, each=6, names="ab")
    a = admission(d)
    for i in range(6):
        assert submit(a, b"a%d" % i, A) is None
    assert submit(a, b"b0", B) is None and submit(a, b"b1", B) is None
    assert submit(a, b"b2", B) == Refusal(503, "queue is full", 1)  # 8 of the total's 8


def test_a_flood_of_one_model_leaves_every_other_its_reserve_of_the_total() -> None:
    """No model has a limit of its own: the total alone. Half of it is kept, in equal shares,
    for the models that hold less than their share: one model's flood is refused while the
    others are still admitted."""
    d, _ = models(Worker(room=0, models=frozenset({A, B, C})), max_queue=12)
    a = admission(d)
    taken = 0
    while submit(a, b"a", A) is None:
        taken += 1
    assert taken == 8  # 12, less the 2 that each of b and c is owed (half of 12, in thirds)
    assert submit(a, b"b", B) is None and submit(a, b"c", C) is None
    assert submit(a, b"b", B) is None and submit(a, b"c", C) is None
    assert submit(a, b"b", B) == Refusal(503, "queue is full", 1)  # the total is full
    d.table.close(C)  # a closed model is owed nothing: b's share is 3 now, it holds 2
    assert d.table.reserved(A, d.max_queue) == 1


def test_a_standing_queue_of_one_model_refuses_only_that_models_texts() -> None:
    """--max-queue-ms: each model's delay is its own line's (the lines are taken in turn), so a
    flood of one model that has stood past the target leaves another model's texts admitted."""
    w = Worker(room=0, models=frozenset({A, B}))
    d, clock = models(w, names="ab")
    d.max_queue_ms = 1000
    assert sum(d.submit([b"y"], 0, Calls(), model=A) is not None for _ in range(20)) == 20
    clock.now += 2 * S
    assert not d.submit([b"y"], 0, Calls(), model=A) and "standing" in d.why
    assert d.submit([b"y"], 0, Calls(), model=B)
    assert d.lanes[A].rejected == 1 and d.lanes[B].rejected == 0


def test_a_model_alone_may_fill_the_whole_total() -> None:
    d, _ = models(Worker(room=0), max_queue=12, names="a")
    assert sum(d.submit([b"x"], 0, Calls()) is not None for _ in range(20)) == 12


def test_a_batch_into_an_empty_model_fits_its_own_limit() -> None:
    d, _ = models(Worker(room=0, models=frozenset({A, B})), max_queue=100, each=20)
    assert d.submit([b"a"] * 40, 0, Calls(), model=A) is None  # past a's own limit
    assert d.submit([b"a"] * 20, 0, Calls(), model=A)  # an empty model takes up to its limit
    assert d.submit([b"b"] * 20, 0, Calls(), model=B)  # and so does b, beside it


def test_frames_for_one_model_are_admitted_in_part_within_its_limit() -> None:
    d, _ = models(Worker(room=0, models=frozenset({A, B})), max_queue=10, each=2)
    a = admission(d)
    made: list[int] = []

    def on_admit(k: int, level: int) -> Calls:
        made.append(k)
        return Calls()

    frames = Ask([b"x", b"y", b"z"], 0, "classify", B, 100 * S, None, "binary")
    got = a.submit_each(frames, on_admit, None)
    assert got == (2, 3) and made == [2] and d.lanes[B].rejected == 1
    assert all(L.split_meta(r.meta)[1] == B for r in d.inflight.values())


# -- closing a model ------------------------------------------------------------------------------
def test_a_closed_model_is_refused_as_unknown_and_what_it_admitted_is_answered() -> None:
    w = Worker(room=1, models=frozenset({A, B}))
    d, _ = models(w)
    a = admission(d)
    done = Calls()
    assert submit(a, b"b0", B, done) is None  # in the ring
    assert submit(a, b"b1", B, done) is None  # waiting
    d.table.close(B)
    assert submit(a, b"b2", B) == Refusal(404, "unknown model: b", 0)
    made: list[int] = []
    frames = a.submit_each(Ask([b"f"], 0, "x", 0, 100 * S), lambda k, lv: made.append(k), None)
    assert frames == (1, 1)  # model 0 is still open
    refused = a.submit_each(Ask([b"f"], 0, "x", B, 100 * S), lambda k, lv: made.append(k), None)
    assert refused == Refusal(404, "unknown model: b", 0) and made == [1]
    assert submit(a, b"never", 9) == Refusal(404, "unknown model: 9", 0)  # never opened
    assert d.rejected == 0  # a 404 is not an overload
    answer(d, w)
    answer(d, w)
    assert len(done.results) == 2 and d.table.depth(B) == 0  # both answered


def test_when_empty_resolves_after_the_models_last_answer() -> None:
    async def main() -> None:
        w = Worker(room=1, models=frozenset({A, B}))
        d, _ = models(w)
        assert d.table.when_empty(B).done()  # nothing admitted: done already
        assert d.table.when_empty(7).done()  # a model never opened holds nothing
        d.submit([b"b0", b"b1"], 0, Calls(), model=B)
        d.submit([b"a0"], 0, Calls(), model=A)
        d.table.close(B)
        empty = d.table.when_empty(B)
        answer(d, w)
        assert not empty.done() and d.table.depth(B) == 1
        answer(d, w)
        assert empty.done() and d.table.depth(B) == 0
        assert d.table.depth(A) == 1  # a's text is still owed: b's wait did not need it
        await empty

    asyncio.run(main())


def test_when_empty_resolves_when_the_last_text_expires() -> None:
    async def main() -> None:
        d, clock = models(Worker(room=0, models=frozenset({B})))
        d.submit([b"b0"], clock.now + S, Calls(), model=B)
        empty = d.table.when_empty(B)
        clock.now += 2 * S
        assert d.expire(clock.now) == 1 and empty.done()
        await empty

    asyncio.run(main())


def test_model_indexes_stay_within_the_wire_range() -> None:
    d, _ = models()
    for bad in (-1, L.MAX_MODELS):
        try:
            d.table.open(bad, "x", 0)
        except ValueError:
            continue
        raise AssertionError(f"index {bad} was accepted")


# -- per-model numbers ----------------------------------------------------------------------------
def test_stats_count_each_models_answers_and_batches_once() -> None:
    d, _ = models()
    stats = Stats((16, 64))
    groups = {}
    for index, name in ((A, "a"), (B, "b")):
        d.submit([b"t"], 0, Calls(), model=index)
        groups[name] = next(r.group for r in d.inflight.values() if r.group.model == index)
    batch_of_three = L.pack_batch(3, 16, 5 * S)
    for _ in range(3):  # three answers from one batch of model a
        stats.observe(groups["a"], Result(L.STATUS_OK, batch=batch_of_three, read_ns=6 * S), 10**6)
    stats.observe(groups["b"], Result(L.STATUS_OK, batch=L.pack_batch(1, 16, 7 * S)), 10**6)
    stats.observe(groups["b"], Result(L.STATUS_DEADLINE), 10**6)
    a, b = stats.for_model("a"), stats.for_model("b")
    assert a.answered == 3 and sum(a.batch_hist) == 1 and a.rows == 3
    assert a.batch_hist[L.BATCH_BOUNDS.index(4)] == 1  # 3 rows: the bin of sizes 3 and 4
    assert b.answered == 2 and sum(b.batch_hist) == 1 and b.rows == 1
    assert sum(a.lat[0]) == 3 and sum(b.lat[0]) == 1  # a failed text has no timing
    minute = stats.model_minute("a", stats.cur_sec * S + S // 2)
    assert minute["requests"] == 3 and minute["latency_ms"]["p50"] is not None


def test_requests_total_counts_each_answer_once_with_many_models() -> None:
    stats = Stats((16,))
    stats.count("http", 200, 3, model="a")
    stats.count("http", 200, 2, model="b")
    stats.count("http", 400)  # about no model: a body that did not parse
    stats.count("binary", 200, 1, model="a")
    one = request_rows(stats.requests_total, stats.requests_by_model, {})
    assert one == [({"protocol": "binary", "code": "200"}, 1),
                   ({"protocol": "http", "code": "200"}, 5),
                   ({"protocol": "http", "code": "400"}, 1)]  # fmt: skip
    many = request_rows(stats.requests_total, stats.requests_by_model, {"a": "a", "b": "b"})
    assert sorted(many, key=str) == sorted(
        [
            ({"protocol": "binary", "code": "200", "model": "a"}, 1),
            ({"protocol": "http", "code": "200", "model": "a"}, 3),
            ({"protocol": "http", "code": "200", "model": "b"}, 2),
            ({"protocol": "http", "code": "400"}, 1),
        ],
        key=str,
    )
    assert sum(n for _, n in many) == sum(n for _, n in one)  # a sum() counts each once


def exposition(d: Dispatcher, stats: Stats) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """The labelled families, as /metrics writes them for this dispatcher and these stats."""
    from prometheus_client.parser import text_string_to_metric_families
    from ringserve.service.ops import prometheus as P

    server: Any = SimpleNamespace(
        dispatcher=d, requests_total=stats.requests_total, api_key=None, keys=None,
        model=SimpleNamespace(name="first"),
    )  # fmt: skip
    models = P.model_labels(server)
    out = P.Exposition()
    P.answers(out, server, stats, models)
    P.timings(out, stats, stats.buckets, models)
    P.worker_counters(out, [0] * (len(S_.WORKER_COUNTERS) + len(L.BATCH_BOUNDS)), stats, models)
    P.model_queues(out, server, models)
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(out.text().decode())
    }


def test_metrics_label_each_model_only_when_there_are_many() -> None:
    d, _ = models(names="a")
    stats = Stats((16,))
    one = exposition(d, stats)
    assert all("model" not in labels for f in one.values() for _, labels, _ in f)
    d.table.open(B, "b", 0)
    for index in (A, B):
        d.submit([b"t"], 0, Calls(), model=index)
    for group in {r.group for r in d.inflight.values()}:
        name = group.model_name
        stats.count("http", 200, model=name)
        stats.observe(group, Result(L.STATUS_OK, batch=L.pack_batch(2, 16, S), read_ns=S), 10**6)
    stats.count("http", 404)  # about no model
    many = exposition(d, stats)
    requests = {(lb.get("model"), lb["code"]): v for _, lb, v in many["ringserve_requests"]}
    assert requests == {("a", "200"): 1, ("b", "200"): 1, (None, "404"): 1}
    lat = {
        lb["model"]: v
        for n, lb, v in many["ringserve_request_latency_seconds"]
        if n.endswith("_count")
    }
    assert lat == {"a": 1, "b": 1}
    sizes = {lb["model"]: v for n, lb, v in many["ringserve_batch_size"] if n.endswith("_sum")}
    assert sizes == {"a": 2, "b": 2}  # one batch of 2 rows each (answers name their batch)
    depth = {lb["model"]: v for _, lb, v in many["ringserve_model_queue_depth"]}
    assert depth == {"a": 1, "b": 1}  # admitted, not answered (the stats saw made-up answers)


def test_stats_show_each_served_model_once_by_name() -> None:
    """/v1/stats' models: a closed model shows while it owes answers; an old version and the
    one that follows it (a new index, the same name) show as one."""
    from ringserve.service.ops.metrics import Metrics

    w = Worker(room=0, models=frozenset({A, B, C}))
    d, clock = models(w, names="ab")
    stats = Stats((16,))
    server: Any = SimpleNamespace(
        stats=stats, dispatcher=d, log=None, supervisor=SimpleNamespace(all={}),
        model=SimpleNamespace(name="first"),
    )  # fmt: skip
    m = Metrics(server)
    d.submit([b"old"], clock.now + S, Calls(), model=B)
    d.table.open(C, "b", 4)  # b's next version
    d.table.close(B)
    d.submit([b"new"] * 2, clock.now + S, Calls(), model=C)
    shown = m.models(clock.now)
    assert set(shown) == {"a", "b"}
    assert shown["b"]["index"] == C and shown["b"]["open"] and shown["b"]["max_queue"] == 4
    assert shown["b"]["queue_depth"] == 3 and shown["b"]["waiting"] == 3
    assert shown["a"]["max_queue"] == 1000 and shown["a"]["queue_depth"] == 0
    d.table.close(C)
    clock.now += 2 * S
    d.expire(clock.now)  # every b text answered (504): closed and owing nothing
    assert set(m.models(clock.now)) == {"a"}
