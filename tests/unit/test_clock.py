"""In-process tests on a fake clock: the HTTP timeouts and the dispatcher, in milliseconds.

No server, no sockets: each object is given a clock the test moves by hand (STYLE.md lesson 19),
so the branches that need a long wait on the wall clock (a read timeout, an idle keep-alive, a
client that never reads) run at once. The transport and the worker are stand-ins that record
what they are asked to do; everything under test is the production code.
"""

from __future__ import annotations

from ringserve.service.config.settings import Config
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.dispatcher import BULK, Dispatcher, Result
from ringserve.service.engine.requests import Ask
from ringserve.service.protocols import admit
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.http import MAX_PIPELINE, Exchange, HttpProtocol, HttpServerState
from ringserve.shm import layout as L

from devkit.fakes import Calls, Clock, S, Transport
from devkit.fakes import RingWorker as Worker

# -- HTTP timeouts --------------------------------------------------------------------------------
SETTINGS = Config(read_timeout_s=10.0, keepalive_timeout_s=100.0, write_timeout_s=30.0)


def answer_at_once(conn: HttpProtocol, ex: Exchange) -> None:
    conn.respond(ex, 200, b"{}")


def connection(router=answer_at_once) -> tuple[HttpProtocol, Transport, Clock, list[int]]:
    clock, counted = Clock(), []
    state = HttpServerState(SETTINGS, router, lambda _p, code, *_: counted.append(code), clock)
    conn, transport = HttpProtocol(state), Transport()
    conn.connection_made(transport)
    return conn, transport, clock, counted


def test_partial_head_past_the_read_timeout_is_answered_408() -> None:
    conn, transport, clock, counted = connection()
    conn.data_received(b"GET /v1/model HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    clock.now += int(9.9 * S)
    conn.sweep(clock.now)
    assert not transport.closed and transport.written == b""
    clock.now += int(0.2 * S)
    conn.sweep(clock.now)
    assert transport.written.startswith(b"HTTP/1.1 408 ") and transport.closed
    assert counted == [408]


def test_read_timeout_counts_from_the_first_byte_of_a_request() -> None:
    conn, transport, clock, _ = connection()
    clock.now += 50 * S  # idle time before the request is not the request's
    conn.data_received(b"POST /v1/classify HTTP/1.1\r\nContent-Length: 10\r\n\r\n{")
    clock.now += 9 * S
    conn.data_received(b'"te')  # trickling does not restart the clock
    clock.now += int(1.5 * S)
    conn.sweep(clock.now)
    assert transport.written.startswith(b"HTTP/1.1 408 ")


def test_no_read_timeout_while_we_owe_answers_and_stopped_reading() -> None:
    owed: list[Exchange] = []
    conn, transport, clock, _ = connection(lambda c, ex: owed.append(ex))  # answers held back
    conn.data_received(b"GET /a HTTP/1.1\r\n\r\n" * MAX_PIPELINE)  # as many as may be owed
    assert not transport.reading
    conn.data_received(b"GET /b HTTP/1.1\r\n")  # a partial head, buffered while paused
    clock.now += 100 * S  # the wait is ours, not the client's
    conn.sweep(clock.now)
    for ex in owed:
        conn.respond(ex, 200, b"{}")
    assert transport.written.count(b"HTTP/1.1 200 ") == MAX_PIPELINE
    assert b" 408 " not in transport.written and not transport.closed


def test_idle_keep_alive_closes_after_its_timeout_without_an_answer() -> None:
    conn, transport, clock, counted = connection()
    conn.data_received(b"GET /v1/model HTTP/1.1\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 200 ") and counted == [200]
    answered = len(transport.written)
    clock.now += 99 * S
    conn.sweep(clock.now)
    assert not transport.closed
    clock.now += 2 * S
    conn.sweep(clock.now)
    assert transport.closed and not transport.aborted
    assert len(transport.written) == answered  # nothing more written: no answer is owed


def test_client_that_never_reads_is_aborted_after_the_write_timeout() -> None:
    conn, transport, clock, _ = connection()
    conn.data_received(b"GET /v1/model HTTP/1.1\r\n\r\n")
    conn.pause_writing()  # the transport's buffer is full: the client does not read
    clock.now += 29 * S
    conn.sweep(clock.now)
    assert not transport.closed
    conn.resume_writing()  # it read some: the clock starts again at the next pause
    clock.now += 5 * S
    conn.pause_writing()
    clock.now += 29 * S
    conn.sweep(clock.now)
    assert not transport.closed
    clock.now += 2 * S
    conn.sweep(clock.now)
    assert transport.aborted  # close() would wait for a peer that never reads


# -- the dispatcher -------------------------------------------------------------------------------
def dispatcher(*workers: Worker, max_queue: int = 8) -> tuple[Dispatcher, Clock]:
    clock = Clock()
    d = Dispatcher(max_queue, clock)
    d.serving = list(workers)
    return d, clock


def test_admission_refuses_a_group_past_the_queue_bound_whole() -> None:
    d, clock = dispatcher(Worker(), max_queue=4)
    done = Calls()
    assert d.submit([b"a", b"b", b"c"], clock.now + S, done)
    assert not d.submit([b"d", b"e"], clock.now + S, done)  # 3 + 2 > 4: all or nothing
    assert d.submit([b"d"], clock.now + S, done)
    assert d.depth == 4 and d.rejected == 2
    d.stop_accepting()  # draining
    assert not d.submit([b"e"], clock.now + S, done)
    assert d.rejected == 3 and done.results == []


def test_least_loaded_placement_and_waiting_when_rings_are_full() -> None:
    a, b = Worker(room=2), Worker(room=1)
    d, clock = dispatcher(a, b)
    assert d.submit([b"1", b"2", b"3", b"4", b"5"], clock.now + S, Calls())
    assert [m[1] for m in a.ring] == [b"1", b"3"] and [m[1] for m in b.ring] == [b"2"]
    assert [r.payload for r in d.waiting] == [b"4", b"5"]
    a.answer()
    d.answers.read(a)  # answers read: the waiting ones take the room they leave
    assert [m[1] for m in a.ring] == [b"4", b"5"] and not d.waiting


def test_a_new_request_never_overtakes_a_waiting_one() -> None:
    w = Worker(room=2)
    d, clock = dispatcher(w)
    d.submit([b"1", b"2", b"3"], clock.now + S, Calls())
    assert [r.payload for r in d.waiting] == [b"3"]
    w.answer()  # room in the ring before the loop has read the answers
    d.submit([b"4"], clock.now + S, Calls())
    assert [m[1] for m in w.ring] == [b"3", b"4"]


def test_answers_complete_a_group_once_with_its_latency_on_the_clock() -> None:
    w = Worker()
    d, clock = dispatcher(w)
    seen: list[int] = []
    d.answers.on_result = lambda group, result, latency_ns: seen.append(latency_ns)
    done = Calls()
    d.submit([b"x", b"y"], clock.now + S, done)
    clock.now += 3_000_000
    w.answer(label=1)
    d.answers.read(w)
    (results,) = done.results
    assert [r.label_id for r in results] == [1, 1] and results[0].scores is not None
    assert seen == [3_000_000, 3_000_000] and d.depth == 0


def test_the_latency_header_is_read_on_the_dispatchers_clock() -> None:
    """X-Latency-Ms spans the request's last byte to its answer, both on the one clock the
    dispatcher and the connection share (app.py hands the dispatcher's to the HTTP state)."""
    w = Worker()
    d, clock = dispatcher(w)
    admission = Admission(d, lambda: "queue is full", 30.0)

    def route(conn: HttpProtocol, ex: Exchange) -> None:
        def answer(_results: list[Result]) -> None:
            conn.respond(ex, 200, b"{}", extra=[latency_header(conn, ex)])

        admit.submit(admission, conn, ex, Ask([b"x"]), answer)

    conn = HttpProtocol(HttpServerState(SETTINGS, route, lambda *_: None, d.clock))
    transport = Transport()
    conn.connection_made(transport)
    conn.data_received(b"POST /v1/classify HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert transport.written == b"" and len(w.ring) == 1
    clock.now += 12_345_678  # the worker takes 12.3 ms on the fake clock
    w.answer()
    d.answers.read(w)
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nx-latency-ms: 12.3\r\n" in transport.written.lower(), transport.written


def test_reroute_puts_a_dead_workers_requests_first_in_their_order() -> None:
    dead, alive = Worker(), Worker(room=0)
    d, clock = dispatcher(dead)
    done = Calls()
    d.submit([b"1", b"2", b"3", b"4"], clock.now + S, done)
    d.serving = [alive]  # the supervisor swapped the dead one out
    d.submit([b"5"], clock.now + S, done)  # waits: the new worker's ring is full for now
    assert d.reroute(dead) == 4
    alive.room = 100
    d.flush_waiting()
    assert [m[1] for m in alive.ring] == [b"1", b"2", b"3", b"4", b"5"]
    dead.answer()  # a late answer from the dead worker's ring is dropped
    d.answers.read(dead)
    assert done.results == []
    alive.answer()
    d.answers.read(alive)
    assert len(done.results) == 2 and d.depth == 0  # each group answered once


def test_expiry_answers_504_only_past_the_deadline_and_drops_the_late_answer() -> None:
    w = Worker(room=1)
    d, clock = dispatcher(w)
    early, late = Calls(), Calls()
    d.submit([b"in the ring"], clock.now + 2 * S, early)
    d.submit([b"waiting"], clock.now + 5 * S, late)
    assert len(d.waiting) == 1
    clock.now += 2 * S - 1
    assert d.expire(clock.now) == 0
    clock.now += 1
    assert d.expire(clock.now) == 1  # the deadline itself is past it
    assert [r.status for r in early.results[0]] == [L.STATUS_DEADLINE]
    w.answer()  # its late answer finds nothing to complete
    d.answers.read(w)
    assert len(early.results) == 1
    clock.now += 3 * S
    assert d.expire(clock.now) == 1 and not d.waiting  # a waiting one expires too
    assert [r.status for r in late.results[0]] == [L.STATUS_DEADLINE]
    assert d.expired == 2 and d.depth == 0


def test_no_deadline_never_expires() -> None:
    d, clock = dispatcher(Worker())
    d.submit([b"x"], 0, Calls())  # 0: no deadline
    clock.now += 10**6 * S
    assert d.expire(clock.now) == 0 and d.depth == 1


def measured(d: Dispatcher, w: Worker, clock: Clock, n: int, busy_s: float) -> None:
    """Give the worker n texts of 40 bytes (cost 18 each) that take it busy_s to answer."""
    d.submit([b"x" * 40] * n, 0, Calls())
    clock.now += int(busy_s * S)
    w.answer()
    d.answers.read(w)


def test_the_pool_rate_counts_only_the_time_a_worker_had_work() -> None:
    w = Worker()
    d, clock = dispatcher(w, max_queue=1000)
    assert d.rate() is None and d.wait_ms() == 0.0  # nothing measured, nothing waits
    measured(d, w, clock, 1, 0.1)
    clock.now += 10 * S  # idle: says nothing about its speed
    measured(d, w, clock, 10, 0.2)
    rate = d.rate()
    assert rate is not None and abs(rate - (18 + 180) / 0.3) < 1e-6, rate
    d.serving.append(Worker())  # not measured yet: counts as the mean
    assert d.rate() == 2 * rate


def stalled(max_queue: int = 1024) -> tuple[Dispatcher, Worker, Clock]:
    """A dispatcher whose one worker takes nothing: every admitted text waits in the front-end."""
    w = Worker(room=0)
    d, clock = dispatcher(w, max_queue=max_queue)
    d.max_queue_ms = 1000
    return d, w, clock


def test_a_burst_into_an_empty_queue_is_admitted_whole_up_to_the_ceiling() -> None:
    """A burst arrives together: its delay is measured, not estimated, and none of its texts
    has waited yet, so every one is admitted, in one request or many, up to --max-queue."""
    d, _, clock = stalled()
    assert d.submit([b"x" * 1000] * 256, clock.now + 30 * S, Calls())  # one large batch
    for _ in range(8):
        assert d.submit([b"y" * 1000] * 32, clock.now + 30 * S, Calls())  # 8 more, at once
    singles = sum(d.submit([b"z"], clock.now + 30 * S, Calls()) is not None for _ in range(600))
    assert singles == 1024 - 256 - 256 and d.depth == 1024  # the ceiling, by count alone
    assert d.why == "queue is full" and d.rejected == 600 - singles


def test_a_standing_queue_is_refused_once_its_delay_stays_over_the_target_an_interval() -> None:
    d, w, clock = stalled()
    assert d.submit([b"a"] * 10, clock.now + 30 * S, Calls())
    clock.now += int(1.15 * S)  # over the target, but not yet for CoDel's interval
    assert d.wait_ms() == 1150.0 and d.submit([b"b"], clock.now + 30 * S, Calls())
    clock.now += int(0.06 * S)  # 1,210 ms: over the target for more than 200 ms
    assert not d.submit([b"c"], clock.now + 30 * S, Calls())
    assert "queue is standing" in d.why and "1210 ms" in d.why and d.rejected == 1
    w.room = 1000  # the worker takes what waits: the queue drains
    d.flush_waiting()
    assert d.wait_ms() == 0.0 and d.submit([b"d"], clock.now + 30 * S, Calls())  # recovered


def test_a_queue_that_was_empty_within_the_interval_admits() -> None:
    """The delay is the oldest waiting text's: texts admitted after the queue last emptied
    have waited less than the interval, however long the queue stood before."""
    d, w, clock = stalled()
    d.submit([b"a"], 0, Calls())
    clock.now += 5 * S
    assert not d.submit([b"b"], 0, Calls())  # stood for seconds
    w.room = 1000
    d.flush_waiting()  # emptied
    w.room = len(w.ring)  # and full again at once
    d.submit([b"c"] * 50, 0, Calls())
    clock.now += int(0.19 * S)
    assert d.submit([b"d"], 0, Calls())


def test_no_refusal_by_delay_while_the_pool_replaces_a_worker() -> None:
    """A request never gets 503 merely because its workers died: while a slot waits for its
    replacement the delay is not counted, and once whole it counts from then."""
    d, w, clock = stalled()
    d.submit([b"a"], 0, Calls())
    d.set_serving([], whole=False)  # the worker died
    clock.now += 5 * S
    assert d.delay_ns() == 0 and d.submit([b"b"], 0, Calls())
    d.set_serving([w], whole=True)  # its replacement is ready (and takes nothing yet)
    clock.now += int(0.5 * S)
    assert d.delay_ns() == int(0.5 * S) and d.submit([b"c"], 0, Calls())
    clock.now += int(0.75 * S)
    assert not d.submit([b"d"], 0, Calls())


def test_a_text_admitted_into_a_queue_that_was_not_fresh_waits_at_most_the_target() -> None:
    """The head's age lags: while it is young, overload is still admitted. A text admitted when
    the oldest waiting one had already waited an interval may wait for a worker only until
    --max-queue-ms (less the timer's tick) after its arrival: then it is refused 503, having
    cost no model time. A burst's texts, admitted into a fresh queue, wait as long as their
    deadline allows."""
    d, w, clock = stalled()
    burst, late, taken = Calls(), Calls(), Calls()
    assert d.submit([b"a"] * 4, clock.now + 30 * S, burst)  # into a fresh queue
    clock.now += int(0.3 * S)  # the queue has stood 300 ms: not fresh, not yet standing
    assert d.submit([b"b"] * 2, clock.now + 30 * S, late)
    clock.now += int(0.89 * S)
    assert d.expire(clock.now) == 0 and not late.results  # within its bound
    clock.now += int(0.02 * S)  # 910 ms after its arrival: past 1,000 - 2 x 50
    assert d.expire(clock.now) == 2
    assert [r.status for r in late.results[0]] == [L.STATUS_OVERLOADED] * 2
    assert d.rejected == 2 and not w.ring and not burst.results  # the burst still waits
    clock.now += int(0.05 * S)
    assert d.submit([b"c"], clock.now + 30 * S, taken) is None  # standing now: refused
    w.room = 1000
    d.flush_waiting()  # a worker takes what waits: the burst runs
    clock.now += 5 * S
    assert d.expire(clock.now) == 0 and len(w.ring) == 4


def test_a_queue_that_stood_refuses_at_once_what_its_measured_drain_cannot_answer_in_time() -> None:
    """Past the first interval, the work admitted so far is timed at the rate it is answered
    in this stretch (bounds.Drain): a text it would keep waiting past its bound is refused
    at arrival, not after waiting; one it would not is admitted."""
    w = Worker(room=4)
    d, clock = dispatcher(w, max_queue=1024)
    d.max_queue_ms = 1000
    assert d.submit([b"a"] * 100, clock.now + 30 * S, Calls())  # into a fresh queue: whole
    for _ in range(10):  # the worker answers 4 texts every 50 ms: 80 texts a second
        clock.now += 50_000_000
        w.answer()
        d.answers.read(w)
    assert d.depth == 60 and d.wait_ms() == 500.0
    assert d.submit([b"b"] * 16, clock.now + 30 * S, Calls())  # 60 ahead: about 750 ms
    late = Calls()
    assert not d.submit([b"c"] * 8, clock.now + 30 * S, late)  # 76: 950 ms, over 1000 - 2 x 50
    assert "takes about" in d.why and "over --max-queue-ms 1000" in d.why
    assert d.rejected == 8 and not late.results  # refused at once, counted, never queued
    for _ in range(4):  # 200 ms more at the same rate: 16 fewer ahead
        clock.now += 50_000_000
        w.answer()
        d.answers.read(w)
    assert d.submit([b"d"] * 8, clock.now + 30 * S, Calls())  # 60 ahead: 750 ms again


def test_a_request_a_worker_has_started_is_never_refused_at_its_queue_bound() -> None:
    d, w, clock = stalled()
    d.submit([b"a"], 0, Calls())
    clock.now += int(0.3 * S)
    started = Calls()
    w.room = 2  # the worker takes the head and the first text of the next request
    d.submit([b"b"] * 3, 0, started)
    d.flush_waiting()
    clock.now += 2 * S
    assert d.expire(clock.now) == 0 and len(d.waiting) == 2  # its rest waits, to run whole


def test_no_text_is_refused_at_its_queue_bound_while_the_pool_replaces_a_worker() -> None:
    d, _, clock = stalled()
    d.submit([b"a"], 0, Calls())
    clock.now += int(0.3 * S)
    d.submit([b"b"], 0, Calls())
    d.set_serving([], whole=False)  # the worker died: what waits waits for its replacement
    clock.now += 2 * S
    assert d.expire(clock.now) == 0 and d.depth == 2


def test_a_batch_request_fills_what_is_free_by_count() -> None:
    d, _ = dispatcher(Worker(), max_queue=100)
    done = Calls()
    assert d.submit([b"big"] * 100, 0, done)  # into an empty queue any batch fits
    d.fail_all()
    assert not d.submit([b"big"] * 101, 0, done)  # never past --max-queue
    for _ in range(40):
        assert d.submit([b"one"], 0, done)
    assert not d.submit([b"b"] * 61, 0, done)  # 60 free
    assert d.why == "queue is full"
    assert d.submit([b"b"] * 60, 0, done)


def test_a_worker_holds_only_what_it_can_start_soon() -> None:
    a, b = Worker(), Worker()
    d, _ = dispatcher(a, b, max_queue=100)
    d.hold_cost = 100  # five texts of cost 18 each
    d.submit([b"x" * 40] * 20, 0, Calls())
    assert len(a.ring) == 5 and len(b.ring) == 5 and len(d.waiting) == 10
    a.answer()
    d.answers.read(a)  # its room is refilled from the front-end's queue, oldest first
    assert [m[0] for m in a.ring] == [11, 12, 13, 14, 15] and len(d.waiting) == 5
    d.serving = [a]  # b died: the supervisor took it out
    moved = d.reroute(b)  # what it held goes before what waited, in order
    assert moved == 5 and [r.id for r in d.waiting] == [2, 4, 6, 8, 10, 16, 17, 18, 19, 20]
    a.answer()
    d.answers.read(a)
    assert [m[0] for m in a.ring] == [2, 4, 6, 8, 10]


def test_a_worker_holding_nothing_takes_a_text_over_the_hold() -> None:
    w = Worker()
    d, _ = dispatcher(w)
    d.hold_cost = 10
    d.submit([b"x" * 400, b"y" * 400], 0, Calls())  # each costs 108
    assert len(w.ring) == 1 and len(d.waiting) == 1


# -- priority: interactive first, bulk never starved ---------------------------------------------
def test_interactive_texts_go_before_waiting_bulk_ones() -> None:
    w = Worker(room=1)
    d, clock = dispatcher(w)
    assert d.submit([b"b1"], clock.now + S, Calls(), priority=BULK)
    assert d.submit([b"b2"], clock.now + S, Calls(), priority=BULK)
    assert d.submit([b"i1"], clock.now + S, Calls())
    bulk = L.request_meta(L.OPT_BULK, 0)  # a bulk text's record carries OPT_BULK (the batcher)
    assert [(m[1], m[3]) for m in w.ring] == [(b"b1", bulk)]
    assert [(r.payload, r.meta) for r in d.waiting] == [(b"i1", 0), (b"b2", bulk)]
    w.answer()
    d.answers.read(w)
    assert [m[1] for m in w.ring] == [b"i1"]  # the interactive text overtook the older bulk one


def flood_until_bulk_runs(bound_ms: float, horizon_ms: int) -> int | None:
    """A worker that takes one text at a time, a bulk text waiting, and a new interactive text
    every 10 ms for `horizon_ms`, more than the worker answers (one each 10 ms): when did the
    bulk text reach the worker (ms after its admission), if ever?"""
    w = Worker(room=1)
    clock = Clock()
    d = Dispatcher(1024, clock, bulk_wait_ms=bound_ms)
    d.serving = [w]
    d.submit([b"i0"], clock.now + 60 * S, Calls())
    d.submit([b"bulk"], clock.now + 60 * S, Calls(), priority=BULK)
    start = clock.now
    for step in range(horizon_ms // 10):
        d.submit([b"i%d" % step, b"j%d" % step], clock.now + 60 * S, Calls())  # 2 per 10 ms
        clock.now += 10_000_000
        w.answer()
        d.answers.read(w)
        if any(m[1] == b"bulk" for m in w.ring):
            return (clock.now - start) // 1_000_000
    return None


def test_a_bulk_text_waits_behind_interactive_ones_at_most_its_bound() -> None:
    """With interactive texts arriving faster than the worker answers them, a bulk text goes to
    the worker once it has waited --bulk-max-wait-ms (within one answer's time), and not
    before; with no bound it would wait for ever (here: 5 s of the flood)."""
    assert flood_until_bulk_runs(bound_ms=1e9, horizon_ms=5000) is None  # starved
    for bound in (50, 200, 1000):
        waited = flood_until_bulk_runs(bound_ms=bound, horizon_ms=5000)
        assert waited is not None and bound <= waited <= bound + 10, (bound, waited)


def test_bulk_fills_at_most_its_share_of_the_queue() -> None:
    d, clock = dispatcher(Worker(room=0), max_queue=8)
    for i in range(6):
        assert d.submit([b"b%d" % i], clock.now + S, Calls(), priority=BULK)
    assert not d.submit([b"b6"], clock.now + S, Calls(), priority=BULK)  # 6 = 0.75 x 8
    assert d.submit([b"i0"], clock.now + S, Calls())  # interactive texts still find room
    assert d.submit([b"i1"], clock.now + S, Calls())
    assert not d.submit([b"i2"], clock.now + S, Calls())  # --max-queue holds for all


def test_a_worker_takes_bulk_work_only_below_one_batch() -> None:
    """hold_cost is two batches; bulk texts stop at one, so an interactive text waits behind
    one bulk batch at most, while the worker still takes it at once."""
    w = Worker()
    d, clock = dispatcher(w, max_queue=64)
    d.hold_cost = 2 * 40
    text = b"x" * 48  # cost 48 / 4 + 8 = 20
    for _ in range(3):
        assert d.submit([text], clock.now + S, Calls(), priority=BULK)
    assert len(w.ring) == 2 and len(d.waiting.bulk) == 1  # 40 of bulk: one batch
    assert d.submit([text], clock.now + S, Calls())
    assert len(w.ring) == 3 and not d.waiting.interactive  # interactive: up to two batches


def test_an_interactive_texts_delay_leaves_out_the_bulk_waiting() -> None:
    """Interactive texts go before the bulk texts waiting in the front-end, so a standing line
    of bulk texts refuses bulk texts only: bulk cannot crowd interactive ones out."""
    d, _, clock = stalled()
    assert d.submit([b"y"] * 20, 0, Calls(), priority=BULK)
    clock.now += 2 * S
    assert not d.submit([b"y"], 0, Calls(), priority=BULK)  # the bulk line stands
    assert d.submit([b"x"], 0, Calls())  # interactive: nothing waits before it
    clock.now += 2 * S
    assert not d.submit([b"x"], 0, Calls())  # now its own line stands too
