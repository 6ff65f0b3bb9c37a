"""Admission, protocol-neutral: it admits or says why not (a Refusal), and counts what it
refuses; each protocol writes its own answer. In process, on a fake clock, without workers."""

from __future__ import annotations

from ringserve.service.engine.admission import Admission, Done, Refusal
from ringserve.service.engine.dispatcher import Dispatcher, Result
from ringserve.service.engine.requests import Ask
from ringserve.service.engine.tenants import BULK, INTERACTIVE, Tenant
from ringserve.service.request.texts import checked
from ringserve.shm import layout as L

S = 1_000_000_000


def admission(max_queue: int) -> tuple[Admission, Dispatcher]:
    d = Dispatcher(max_queue, clock=lambda: 5 * S)
    return Admission(d, lambda: d.why, 30.0), d


def ask(texts: list[bytes], deadline: int, protocol: str, task: str = "classify") -> Ask:
    return Ask(texts, 0, task, 0, deadline, None, protocol)


def ignore(results: list[Result]) -> None:
    pass


def test_a_request_is_admitted_whole_or_refused_with_the_reason() -> None:
    a, d = admission(1)
    assert a.submit(ask([b"one"], 10 * S, "http"), ignore, None) is None
    refusal = a.submit(ask([b"two"], 10 * S, "kserve"), ignore, None)
    assert refusal == Refusal(503, "queue is full", 1)
    assert d.rejected == 1 and len(d.inflight) == 1


def test_texts_past_their_deadline_give_their_room_to_a_new_request_at_once() -> None:
    """Between the expiry timer's ticks, a full queue of expired texts answers them 504 (once
    each) and admits the new request, instead of refusing it."""
    now = [5 * S]
    d = Dispatcher(2, clock=lambda: now[0])
    a = Admission(d, lambda: d.why, 30.0)
    got: list[list[Result]] = []
    assert a.submit(ask([b"a", b"b"], 6 * S, "grpc"), got.append, None) is None
    refusal = a.submit(ask([b"c"], 10 * S, "grpc"), got.append, None)
    assert refusal == Refusal(503, "queue is full", 1) and not got  # still due: still held
    now[0] = 6 * S  # their deadline, before any tick of the timer
    assert a.submit(ask([b"c"], 10 * S, "grpc"), got.append, None) is None
    assert [[r.status for r in results] for results in got] == [[L.STATUS_DEADLINE] * 2]
    assert d.expired == 2 and d.rejected == 1 and len(d.inflight) == 1


def test_over_the_key_rate_is_a_429_with_the_wait_and_the_queue_is_untouched() -> None:
    a, d = admission(8)
    tenant = Tenant("beta", rate=0.5, burst=1)
    assert a.submit(ask([b"x"], 10 * S, "grpc"), ignore, tenant) is None
    refusal = a.submit(ask([b"y"], 10 * S, "grpc"), ignore, tenant)
    assert refusal == Refusal(429, "over the key's rate of 0.5 requests/s", 2)
    assert d.rejected == 0 and len(d.inflight) == 1


def test_frames_are_admitted_in_part_and_the_rest_counted_as_refused() -> None:
    a, d = admission(2)
    made: list[tuple[int, int]] = []

    def on_admit(k: int, level: int) -> Done:
        made.append((k, level))
        return ignore

    k, within = a.submit_each(ask([b"a", b"b", b"c"], 10 * S, "binary"), on_admit, None)
    assert (k, within) == (2, 3) and made == [(2, INTERACTIVE)]
    assert d.rejected == 1  # counted by the admission: the protocol only answers it
    a.refuse(2)  # frames a protocol refused itself (past its bound of answers owed)
    assert d.rejected == 3


def test_frames_over_the_key_rate_are_cut_first_and_keep_the_key_priority() -> None:
    a, d = admission(8)
    tenant = Tenant("beta", rate=1.0, burst=2, priority=BULK)
    made: list[tuple[int, int]] = []

    def on_admit(k: int, level: int) -> Done:
        made.append((k, level))
        return ignore

    frames = Ask([b"a", b"b", b"c"], L.OPT_EMBED, "embed", 0, 10 * S, None, "binary")
    k, within = a.submit_each(frames, on_admit, tenant)
    assert (k, within) == (2, 2) and made == [(2, BULK)] and d.rejected == 0
    records = [(r.payload, L.split_meta(r.meta)[0]) for r in d.inflight.values()]
    assert records == [(b"a", L.OPT_EMBED | L.OPT_BULK), (b"b", L.OPT_EMBED | L.OPT_BULK)]


def test_one_text_check_for_every_protocol() -> None:
    assert checked("héllo") == ("héllo".encode(), "")
    assert checked(b"ok") == (b"ok", "")
    assert checked(" \n") == (b"", "is empty") and checked(b"\t") == (b"", "is empty")
    assert checked(b"\xff") == (b"", "is not valid UTF-8")
    assert checked("\ud800") == (b"", "is not valid UTF-8 (lone surrogate)")
    assert checked(3) == (b"", "must be a string")


def test_a_deadline_the_queues_measured_delay_already_passes_is_refused_504_at_once() -> None:
    """Rather than queued to expire: the oldest waiting text has waited 2 s, so a request with
    1 s left cannot be answered in time; one with 3 s left is admitted. Frames alike."""
    now = [5 * S]
    d = Dispatcher(100, clock=lambda: now[0])  # no worker: what is admitted waits
    a = Admission(d, lambda: d.why, 30.0)
    assert a.submit(ask([b"a"], 100 * S, "http"), ignore, None) is None
    now[0] += 2 * S
    refusal = a.submit(ask([b"b"], now[0] + S, "grpc"), ignore, None)
    assert refusal is not None and refusal.code == 504 and refusal.retry_after_s == 0
    assert "measured delay of 2000 ms" in refusal.message
    assert a.submit(ask([b"c"], now[0] + 3 * S, "http"), ignore, None) is None

    def on_admit(k: int, level: int) -> Done:
        return ignore

    late = a.submit_each(ask([b"d", b"e"], now[0] + S, "binary"), on_admit, None)
    assert isinstance(late, Refusal) and late.code == 504
    assert d.depth == 2 and d.rejected == 0  # not counted as the queue's refusals
