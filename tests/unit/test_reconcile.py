"""The supervisor's reconcile on a fake clock, with fake worker handles: the rare branches
(crash backoff, boot timeout, TERM-then-KILL of a stopping worker) in milliseconds.

The worker processes are the only fake here (no process is started); the supervisor, the
dispatcher and the event loop's reader registrations are the real ones, and time is the
supervisor's injectable clock (STYLE.md lesson 19).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from ringserve.service.config.settings import Config
from ringserve.service.engine.dispatcher import Dispatcher, Result
from ringserve.service.pool.policy import CRASH_LIMIT, STABLE_S
from ringserve.service.pool.supervisor import Supervisor
from ringserve.service.pool.watch import BOOT_TIMEOUT_S, KILL_AFTER_S
from ringserve.shm import layout as L
from ringserve.shm.doorbell import EventFd
from ringserve.shm.segment import SegmentError
from ringserve.workers.spec import EXIT_BOOT_ERROR, EXIT_DEVICE_ERROR, ModelRef


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeProcess:
    def __init__(self) -> None:
        self.exitcode: int | None = None

    def join(self, timeout: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


class FakeCtl:
    def __init__(self) -> None:
        self.state = L.W_STARTING

    def get(self, name: str) -> int:
        return self.state if name == "state" else 0

    def heartbeat_age_ms(self) -> float | None:
        return 1.0 if self.state != L.W_STARTING else None


class NoAnswers:
    """An empty response ring."""

    def read(self, limit: int = 0) -> list[tuple[int, int, bytes]]:
        return []


class FakeLink:
    """What the dispatcher reads of a WorkerLink: no ring behind it, no answers."""

    def __init__(self, serial: int, ctl: FakeCtl) -> None:
        self.serial, self.ctl = serial, ctl
        self.models = frozenset({0})
        self.assigned: dict[int, Any] = {}
        self.draining = self.gone = False
        self.responses = NoAnswers()
        self.eventfd = EventFd()

    def loaded(self) -> bool:
        return self.ctl.state in (L.W_READY, L.W_DEGRADED)

    def submit(self, messages: list[Any]) -> int:
        """Its request ring (a warm-up's texts): taken whole, never answered by itself."""
        return len(messages)

    def drain(self) -> None:
        self.draining = True

    def lose(self) -> None:
        self.gone = True


class FakeHandle:
    """What the supervisor reads and calls on a WorkerHandle, with no process behind it."""

    made: list[FakeHandle] = []

    def __init__(self, serial: int, cpus: list[int], device: str, *rest: Any) -> None:
        self.serial, self.cpus, self.device = serial, list(cpus), device
        self.generation = rest[1]
        self.refs = rest[3] if len(rest) > 3 else ()  # the ModelRefs it was told to serve
        self.slot: int | None = None
        self.forked = False
        self.started_at = 0.0
        self.ready_at: float | None = None
        self.kill_sent_at: float | None = None
        self.exitcode: int | None = None
        self.ctl = FakeCtl()
        self.link = FakeLink(serial, self.ctl)
        self.link.models = frozenset(r.index for r in self.refs) or frozenset({0})
        self.process = FakeProcess()
        self.sentinel_fd = EventFd()
        self.signals: list[int] = []
        self.pid = 100 + serial
        FakeHandle.made.append(self)

    @property
    def sentinel(self) -> int:
        return self.sentinel_fd.fd

    @property
    def draining(self) -> bool:
        return self.link.draining

    @property
    def dead(self) -> bool:
        return self.link.gone

    def drain(self) -> None:
        self.link.drain()

    def mark_dead(self) -> None:
        self.link.lose()

    def start(self, zygote: Any = None) -> None:
        pass

    def loaded(self) -> bool:
        return self.ctl.state in (L.W_READY, L.W_DEGRADED)

    def serving(self) -> bool:
        return not self.dead and not self.draining and self.slot is not None and self.loaded()

    def signal(self, signum: int) -> None:
        self.signals.append(signum)

    def terminate(self, now: float) -> None:
        self.signal(signal.SIGTERM)
        if self.kill_sent_at is None:
            self.kill_sent_at = now

    def reap(self) -> int | None:
        self.exitcode = self.process.exitcode
        return self.exitcode

    def release(self) -> None:
        self.link.eventfd.close()
        self.sentinel_fd.close()

    def pin(self, cpus: list[int]) -> None:
        self.cpus = list(cpus)

    def rss_bytes(self) -> int:
        return 0

    # -- test helpers ---------------------------------------------------------------------------
    def boot(self) -> None:
        self.ctl.state = L.W_READY

    def exit(self, code: int) -> None:
        self.process.exitcode = code


@pytest.fixture
def pool() -> Iterator[tuple[Supervisor, Clock]]:
    FakeHandle.made = []
    clock = Clock()
    loop = asyncio.new_event_loop()
    config = Config(workers=1, spares=0, start_method="spawn")
    sup = Supervisor(config, Dispatcher(64), "/nowhere", "cpu", clock=clock, make_handle=FakeHandle)
    sup.procs.loop = loop
    try:
        yield sup, clock
    finally:
        for h in FakeHandle.made:
            h.release()
        loop.close()


def serving_handle(sup: Supervisor) -> FakeHandle:
    handle = sup.slots[0]
    assert isinstance(handle, FakeHandle)
    return handle


def crash(sup: Supervisor, clock: Clock) -> FakeHandle:
    """Boot slot 0's worker, then let it die by SIGKILL; returns the dead handle."""
    handle = serving_handle(sup)
    handle.boot()
    sup.check()
    clock.now += 1.0
    handle.exit(-signal.SIGKILL)
    sup.on_exit(handle)  # what the sentinel's reader calls
    return handle


def test_crash_backoff_holds_the_slot_empty_until_the_delay_passes(pool) -> None:
    sup, clock = pool
    sup.reconcile()
    for _ in range(CRASH_LIMIT - 1):  # each crash is replaced at once
        dead = crash(sup, clock)
        assert sup.slots[0] is not None and sup.slots[0] is not dead
    crash(sup, clock)  # the CRASH_LIMIT-th within the window: back off
    assert sup.slots[0] is None
    delay = sup.policy.backoff_until[0] - clock.now
    assert 0 < delay <= 30.0
    sup.reconcile()
    assert sup.slots[0] is None, "restarted during the backoff"
    clock.now += delay / 2
    sup.reconcile()
    assert sup.slots[0] is None
    clock.now += delay / 2 + 0.01
    sup.reconcile()
    assert sup.slots[0] is not None
    assert sup.restarts[0] == CRASH_LIMIT


def test_boot_timeout_kills_and_replaces_a_worker_that_never_loads(pool) -> None:
    sup, clock = pool
    sup.reconcile()
    stuck = serving_handle(sup)
    clock.now += BOOT_TIMEOUT_S - 1
    sup.check()
    assert not stuck.dead and sup.slots[0] is stuck
    clock.now += 2
    sup.check()
    assert stuck.dead
    assert signal.SIGKILL in stuck.signals  # still running: killed, released once it exits
    assert sup.slots[0] is not None and sup.slots[0] is not stuck
    assert sup.restarts[0] == 1


def test_a_stopping_worker_gets_sigkill_after_the_drain_grace(pool) -> None:
    sup, clock = pool
    sup.reconcile()
    old = serving_handle(sup)
    old.boot()
    sup.check()
    assert sup.restart(0)
    assert old.draining and old.signals == [signal.SIGTERM]  # nothing in flight: TERM at once
    clock.now += KILL_AFTER_S - 0.1
    sup.check()
    assert signal.SIGKILL not in old.signals
    clock.now += 0.2
    sup.check()
    assert signal.SIGKILL in old.signals
    sup.reconcile()
    assert sup.slots[0] is not None and sup.slots[0] is not old


def test_device_error_is_retried_but_a_model_boot_error_stops_the_server(pool) -> None:
    sup, clock = pool
    sup.reconcile()
    first = serving_handle(sup)
    first.exit(EXIT_DEVICE_ERROR)  # the GPU failed; the model itself is fine
    sup.on_exit(first)
    assert sup.fatal is None
    clock.now += 1.0  # past the device retry's short delay
    sup.reconcile()
    assert sup.slots[0] is not None and sup.slots[0] is not first
    second = serving_handle(sup)
    second.exit(EXIT_BOOT_ERROR)
    sup.on_exit(second)
    assert sup.fatal is not None and "could not load the model" in sup.fatal


def test_a_crash_looping_spare_backs_off(pool) -> None:
    sup, clock = pool
    sup.target_spares = 1
    sup.reconcile()
    serving_handle(sup).boot()
    sup.check()
    sup.reconcile()
    for _ in range(CRASH_LIMIT):
        assert len(sup.spares) == 1
        spare = sup.spares[0]
        clock.now += 0.5
        spare.exit(1)
        sup.on_exit(spare)
    assert not sup.spares, "a spare crashing for the fifth time was restarted at once"
    clock.now += 31.0
    sup.reconcile()
    assert len(sup.spares) == 1


def test_workers_killed_after_serving_a_while_are_replaced_at_once(pool) -> None:
    """Many kills in a row are no crash loop when each victim had been ready for STABLE_S."""
    sup, clock = pool
    sup.reconcile()
    for _ in range(3 * CRASH_LIMIT):
        handle = serving_handle(sup)
        handle.boot()
        sup.check()
        clock.now += STABLE_S + 0.1
        handle.exit(-signal.SIGKILL)
        sup.on_exit(handle)
        assert sup.slots[0] is not None and sup.slots[0] is not handle
    assert 0 not in sup.policy.backoff_until


class Events:
    """The supervisor's structured events, kept in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, level: int = 0, **fields: Any) -> None:
        self.seen.append((event, fields))


def test_a_sentinel_that_fires_before_the_exit_status_waits_for_it(pool, monkeypatch) -> None:
    """The sentinel can be readable a moment before waitpid has a status (a forked worker not
    yet re-parented here): the death is reported once the status is there, as -9 for SIGKILL,
    and with no code only when none comes within EXIT_STATUS_WAIT_S."""
    sup, _clock = pool
    events = Events()
    sup.events = events
    sup.reconcile()
    handle = serving_handle(sup)
    handle.boot()
    sup.check()
    sup.on_exit(handle)  # fired, but no status yet
    assert not handle.dead and sup.slots[0] is handle
    handle.exit(-signal.SIGKILL)
    sup.on_exit(handle)  # the loop calls it again: the sentinel is still readable
    died = [f for e, f in events.seen if e == "worker_died"]
    assert handle.dead and [d["exit_code"] for d in died] == [-signal.SIGKILL]
    assert died[0]["reason"] == "exited with code -9"
    monkeypatch.setattr("ringserve.service.pool.watch.EXIT_STATUS_WAIT_S", 0.0)
    other = serving_handle(sup)
    other.boot()
    sup.check()
    sup.on_exit(other)  # reaped elsewhere: no status will ever come
    assert other.dead
    assert [f["exit_code"] for e, f in events.seen if e == "worker_died"] == [-9, None]


def test_set_models_rolls_every_worker_onto_the_new_list(pool) -> None:
    sup, _clock = pool
    sup.reconcile()
    old = serving_handle(sup)
    old.boot()
    sup.check()
    refs = (ModelRef(0, "a", 1, "/a"), ModelRef(1, "b", 1, "/b"))
    generation = sup.set_models(refs)
    assert not sup.rolls.done(generation)
    sup.reconcile()  # somewhere to roll to: a spare of the new generation
    assert len(sup.spares) == 1 and sup.spares[0].refs == refs
    sup.reconcile()
    assert sup.slots[0] is old, "the old worker left before its replacement was ready"
    sup.spares[0].boot()
    sup.reconcile()
    new = serving_handle(sup)
    assert new is not old and new.refs == refs and old.draining
    assert sup.rolls.done(generation)
    done = asyncio.run(sup.rolls.wait(generation))
    assert done is None
    with pytest.raises(ValueError):
        sup.set_models(())


def test_a_load_whose_workers_cannot_boot_fails_the_load_not_the_server(pool) -> None:
    sup, _clock = pool
    sup.reconcile()
    old = serving_handle(sup)
    old.boot()
    sup.check()
    generation = sup.set_models((ModelRef(0, "a", 1, "/a"), ModelRef(1, "b", 1, "/b")), True)
    sup.reconcile()
    spare = sup.spares[0]
    spare.exit(EXIT_BOOT_ERROR)
    sup.on_exit(spare)
    assert sup.fatal is None and sup.slots[0] is old and not old.draining
    why = asyncio.run(sup.rolls.wait(generation))
    assert why is not None and "could not load" in why
    back = sup.set_models((ModelRef(0, "a", 1, "/a"),))  # the caller rolls back
    assert sup.rolls.tentative is None and back > generation


# -- issue 56: a full /dev/shm, a roll's warm-up and its roll back ---------------------------------
def test_a_spawn_with_no_room_for_its_segments_is_refused_said_and_tried_again(pool) -> None:
    sup, clock = pool
    events = Events()
    sup.events = events
    made = sup.procs.make_handle

    def no_room(*args: Any) -> FakeHandle:
        raise SegmentError("no room in /dev/shm for a 2.0 MiB segment (0.1 MiB free)")

    sup.procs.make_handle = no_room
    sup.reconcile()
    assert sup.slots[0] is None and sup.fatal is None
    refused = [f for e, f in events.seen if e == "worker_spawn_refused"]
    assert refused == [{"worker": 0, "reason": "no room in /dev/shm for a 2.0 MiB segment "
                        "(0.1 MiB free)", "retry_in_s": 0.5, "serving": 0}]  # fmt: skip
    sup.reconcile()  # held back: no second try at once
    assert len([e for e, _ in events.seen if e == "worker_spawn_refused"]) == 1
    clock.now += 0.6
    sup.reconcile()  # tried again, refused again: the wait doubles
    assert [f["retry_in_s"] for e, f in events.seen if e == "worker_spawn_refused"] == [0.5, 1.0]
    sup.procs.make_handle = made
    clock.now += 1.1
    sup.reconcile()
    assert isinstance(sup.slots[0], FakeHandle)


def roll_onto_two_models(sup: Supervisor) -> tuple[FakeHandle, FakeHandle, int]:
    """Slot 0's worker serves; a tentative roll onto two models starts, its spare loads."""
    sup.reconcile()
    old = serving_handle(sup)
    old.boot()
    sup.check()
    refs = (ModelRef(0, "a", 1, "/a"), ModelRef(1, "b", 1, "/b"))
    generation = sup.set_models(refs, tentative=True)
    sup.reconcile()
    spare = sup.spares[0]
    spare.boot()
    sup.worker_ready(spare)  # its first doorbell: the warm-up goes into its ring
    sup.reconcile()
    return old, spare, generation


def warm_up_answer(handle: FakeHandle, status: int) -> None:
    """The worker answers its warm-up texts (what Answers.read does with its ring's records)."""
    reqs = list(handle.link.assigned.values())
    assert reqs and all(r.group.protocol == "warm-up" for r in reqs)
    handle.link.assigned.clear()
    reqs[0].group.callback([Result(status) for _ in reqs])


def test_a_roll_serves_its_new_workers_only_once_they_answered_a_warm_up(pool) -> None:
    sup, _clock = pool
    old, spare, generation = roll_onto_two_models(sup)
    assert len(spare.link.assigned) == 2  # one text for each model it holds
    assert sup.slots[0] is old and not old.draining, "served before its warm-up"
    assert sup.ready_count() == 1 and not sup.rolls.done(generation)
    warm_up_answer(spare, L.STATUS_OK)
    sup.reconcile()
    assert sup.slots[0] is spare and old.draining and sup.rolls.done(generation)
    assert asyncio.run(sup.rolls.wait(generation)) is None


def test_a_failed_warm_up_fails_the_roll_and_the_roll_back_keeps_the_old_workers(pool) -> None:
    sup, _clock = pool
    old, spare, generation = roll_onto_two_models(sup)
    warm_up_answer(spare, L.STATUS_INTERNAL)
    assert spare.dead and signal.SIGKILL in spare.signals and sup.fatal is None
    why = asyncio.run(sup.rolls.wait(generation))
    assert why is not None and "warm-up was answered internal error" in why
    kept = sup.roll_back((ModelRef(0, "a", 1, "/a"),), generation)
    sup.reconcile()
    assert sup.slots[0] is old and old.generation == kept and not old.draining
    assert old.link in sup.dispatcher.serving and sup.ready_count() == 1
    assert all(h.generation == kept for h in sup.spares)  # the failed roll's are gone


def test_after_a_roll_back_a_replacement_that_cannot_load_does_not_stop_the_server(
    pool,
) -> None:
    """The directory still holds what failed: a worker started later for the kept generation
    loads it and fails; the server keeps serving (and backs that slot off), never exits."""
    sup, clock = pool
    sup.reconcile()
    old = serving_handle(sup)
    old.boot()
    sup.check()
    generation = sup.set_models((ModelRef(0, "a", 1, "/a"), ModelRef(1, "b", 1, "/b")), True)
    sup.reconcile()
    spare = sup.spares[0]
    spare.exit(EXIT_BOOT_ERROR)  # it cannot load the new list
    sup.on_exit(spare)
    assert sup.fatal is None
    assert "could not load" in (asyncio.run(sup.rolls.wait(generation)) or "")
    sup.roll_back((ModelRef(0, "a", 1, "/a"),), generation)
    clock.now += 10.0
    old.exit(-signal.SIGKILL)  # the kept worker dies; its replacement cannot load
    sup.on_exit(old)
    fresh = serving_handle(sup)
    fresh.exit(EXIT_BOOT_ERROR)
    sup.on_exit(fresh)
    assert sup.fatal is None
    clock.now += 1.0
    sup.reconcile()  # tried again (once the artifact is put right, it loads)
    again = serving_handle(sup)
    assert again is not fresh and not again.dead
    again.boot()
    sup.worker_ready(again)  # a worker of the kept generation serves once warm
    assert sup.ready_count() == 0
    warm_up_answer(again, L.STATUS_OK)
    assert sup.ready_count() == 1 and again.link in sup.dispatcher.serving
