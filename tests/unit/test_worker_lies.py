"""A worker that lies is a dead worker (issue 56): whatever it writes in its response ring (a
tail past the ring, a record whose length and slots disagree, a header counting floats that are
not there, a status or a label no model has) is found before any answer of that read is taken;
the doorbell callback never raises; the worker's owner is told (it kills, replaces and
reroutes), and everything the worker held is still there to reroute.

The lies are the test hook's own (workers/process/lies.py, RINGSERVE_TEST_LYING_WORKER), written
here into a real response ring in this process; tests/system/test_hostile_shm.py runs one in a
real worker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from ringserve.service.engine.dispatcher import Dispatcher, Result
from ringserve.service.engine.link import WorkerLink
from ringserve.shm import layout as L
from ringserve.shm.ring import RingError
from ringserve.shm.segment import list_segments
from ringserve.workers.process.lies import KINDS, Lie

from devkit.ring import PID, new_segment, set_counters

SERIALS = iter(range(970_001, 980_000))
WHY = {
    "tail": "not within one ring",
    "record": "disagrees with its 1 slots",
    "payload": "for a header and 1000 floats",
    "status": "unknown status 200",
    "label": "200 floats and label 150",
}


class Owner:
    """The pool as the dispatcher tells it about a worker."""

    def __init__(self) -> None:
        self.faulty: list[tuple[WorkerLink, str]] = []

    def worker_ready(self, worker: WorkerLink) -> None:
        pass

    def worker_drained(self, worker: WorkerLink) -> None:
        pass

    def worker_faulty(self, worker: WorkerLink, reason: str) -> None:
        self.faulty.append((worker, reason))


@pytest.fixture
def served() -> Iterator[tuple[Dispatcher, WorkerLink, Owner]]:
    """A dispatcher serving one model of two labels on one worker, whose rings are real."""
    loop = asyncio.new_event_loop()
    d = Dispatcher(64)
    d.table.open(0, "sst2", 64, shape=(2, 0))
    link = WorkerLink.open(PID, next(SERIALS), 64, 256, frozenset({0}))
    owner = Owner()
    d.answers.add(link, loop, owner)
    link.ctl.set("state", L.W_READY)
    d.set_serving([link], whole=True)
    try:
        yield d, link, owner
    finally:
        d.answers.remove(link)
        link.release()
        loop.close()
        assert list_segments(PID) == []


def honest(label: int = 1) -> bytes:
    scores = np.array([0.25, 0.75], dtype="<f4").tobytes()
    return L.pack_response(L.STATUS_OK, 0, label, 2) + scores


@pytest.mark.parametrize("kind", KINDS)
def test_a_lie_condemns_the_worker_and_takes_nothing_it_held(served: Any, kind: str) -> None:
    d, link, owner = served
    done: list[list[Result]] = []
    assert d.submit([b"one", b"two"], 0, done.append)
    first, second = sorted(link.assigned)
    link.responses.write_many([(first, honest(), 0, 0)])  # an honest answer, then the lie
    Lie(kind, 0).tell(link.responses, second)
    d.answers.doorbells.rang(link)  # the loop's reader callback: never raises
    assert [(w, WHY[kind] in why) for w, why in owner.faulty] == [(link, True)], owner.faulty
    assert done == [] and sorted(link.assigned) == [first, second]  # nothing of it was taken
    d.answers.doorbells.rang(link)  # read no more: not told twice
    d.answers.read(link)
    assert len(owner.faulty) == 1 and len(link.assigned) == 2
    d.set_serving([], whole=False)  # the pool took it out (Supervisor._failed)
    assert d.reroute(link) == 2  # the death path: both texts wait for another worker
    assert not link.assigned and len(d.waiting) == 2 and d.depth == 2


def test_an_answer_of_the_wrong_kind_for_its_request_is_a_lie(served: Any) -> None:
    """Token vectors answered to a text that asked for scores fit no protocol's reply."""
    d, link, owner = served
    assert d.submit([b"one"], 0, lambda results: None)
    (msg_id,) = link.assigned
    head = L.pack_response(L.STATUS_OK, 0, 0, 2, flags=L.RSP_TOKENS, windows=1)
    link.responses.write_many([(msg_id, head + bytes(8), 0, 0)])
    d.answers.doorbells.rang(link)
    assert "token vectors" in owner.faulty[0][1]


def test_honest_answers_are_taken_and_a_reply_that_raises_costs_the_others_nothing(
    served: Any,
) -> None:
    d, link, owner = served
    got: list[int] = []

    def broken(results: list[Result]) -> None:
        raise RuntimeError("a protocol's defect")

    assert d.submit([b"one"], 0, broken)
    assert d.submit([b"two"], 0, lambda results: got.append(results[0].label_id))
    first, second = sorted(link.assigned)
    link.responses.write_many([(first, honest(), 0, 0), (second, honest(0), 0, 0)])
    d.answers.doorbells.rang(link)
    assert got == [0] and owner.faulty == [] and not link.assigned and d.depth == 0


def test_a_tail_more_than_a_ring_ahead_is_refused_before_anything_is_read() -> None:
    seg = new_segment(L.ring_bytes(64, 8))
    try:
        from ringserve.shm.ring import Ring

        Ring(seg, 64, 8).close()
        for head, tail in ((0, 9), (5, 4), (100, 100 + (1 << 40))):
            set_counters(seg, head, tail)
            ring = Ring(seg)
            with pytest.raises(RingError, match="not within one ring"):
                ring.read()
            ring.close()
    finally:
        seg.close()
        seg.unlink()


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"short", "under its 24-byte header"),
        (L.pack_response(L.STATUS_RATE_LIMITED), "unknown status"),
        (L.pack_response(L.STATUS_OK, flags=0x40), "unknown flags"),
        (L.pack_response(L.STATUS_OK, n=3) + bytes(8), "for a header and 3 floats"),
        (L.pack_response(L.STATUS_OK, n=2) + bytes(12), "for a header and 2 floats"),
        (L.pack_response(L.STATUS_OK, label_id=2, n=2) + bytes(8), "label_id 2 of 2"),
        (
            L.pack_response(L.STATUS_OK, n=4, flags=L.RSP_TOKENS, windows=3) + bytes(44),
            "for a header and 12 floats",
        ),
    ],
)
def test_response_problem_names_what_is_malformed(payload: bytes, why: str) -> None:
    assert why in (L.response_problem(payload) or "")


def test_well_formed_responses_pass() -> None:
    for payload in (
        honest(),
        L.pack_response(L.STATUS_TOO_LONG, limit=512, tokens=900),
        L.pack_response(L.STATUS_DEADLINE),
        L.pack_response(L.STATUS_OK, n=2, flags=L.RSP_TOKENS, windows=3) + bytes(24),
        L.pack_response(L.STATUS_OK, n=0),
    ):
        assert L.response_problem(payload) is None


def test_the_hook_lies_once_in_worker_one_only_after_its_honest_answers() -> None:
    assert Lie.from_hook(SimpleNamespace(serial=2), "record") is None  # type: ignore[arg-type]
    assert Lie.from_hook(SimpleNamespace(serial=1), "") is None  # type: ignore[arg-type]
    lie = Lie.from_hook(SimpleNamespace(serial=1), "label:5")  # type: ignore[arg-type]
    assert lie is not None and lie.kind == "label"
    assert [lie.due(2), lie.due(2), lie.due(2)] == [False, False, True]
    lie.told = True
    assert not lie.due(1)
    with pytest.raises(ValueError, match="not one of"):
        Lie("fib", 0)


def test_a_warm_up_is_checked_against_each_models_own_shape(served: Any) -> None:
    """The pool's warm-up (pool/warmup.py) sends one text a model; each answer is read as the
    answer of its own model (the record's meta), and all of them OK make the worker warm."""
    from ringserve.service.pool.warmup import Warmups

    d, link, owner = served
    d.table.open(1, "nli", 64, shape=(3, 0))
    link.models = frozenset({0, 1})
    said: list[str] = []
    rolls = SimpleNamespace(warm=set(), fail=lambda generation, why: said.append(why))
    roster = SimpleNamespace(emit=lambda *a, **k: None, update_serving=lambda: None)
    handle = SimpleNamespace(link=link, serial=link.serial, slot=None, pid=0, generation=1)
    warmups = Warmups(d, lambda: 0.0, rolls, roster, lambda h, why: said.append(why))  # type: ignore[arg-type]
    warmups.send(handle)  # type: ignore[arg-type]
    first, second = sorted(link.assigned)
    three = L.pack_response(L.STATUS_OK, 0, 2, 3) + np.ones(3, dtype="<f4").tobytes()
    link.responses.write_many([(first, honest(), 0, 0), (second, three, 0, 0)])
    d.answers.doorbells.rang(link)
    assert owner.faulty == [] and said == [] and rolls.warm == {link.serial}
    assert not warmups.pending and not link.assigned and d.depth == 0  # never admitted
