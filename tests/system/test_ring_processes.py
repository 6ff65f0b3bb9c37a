"""The SPSC ring between two real processes over real shared memory, and segments a child
process attaches.

The two-process tests spawn one peer child per module that serves many hypothesis examples: for
each example the test process creates a fresh ring segment, tells the child its role (consume
or produce) and the scenario over a pipe, and plays the other side. Every message's payload is
derived from its id and ends in a crc (devkit.ring), so loss, duplication, reordering and
corruption all show.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from ringserve.shm import layout as L
from ringserve.shm import segment as segment_mod
from ringserve.shm.channel import Doorbells
from ringserve.shm.doorbell import EventFd
from ringserve.shm.ring import Ring
from ringserve.shm.segment import Segment, list_segments, remove_stale, segment_name

from devkit.launcher import ROOT
from devkit.ring import PID, Scenario, check, new_segment, scenario_ring, tail_of

SPAWN = multiprocessing.get_context("spawn")
RETRY_S = 0.0005  # producer's pause when the ring is full
STALL_S = 20.0  # no progress for this long is a deadlock, not a slow machine
TWO_PROCESS = settings(max_examples=25, deadline=None)


# -- the two sides, run by either process --------------------------------------------------------
def drained(ring: Ring, gave_up: Callable[[], bool]) -> bool:
    """Poll until the consumer has read everything; False if it gave up first."""
    deadline = time.monotonic() + STALL_S
    while ring.pending():
        if gave_up():
            return False
        if time.monotonic() > deadline:
            raise AssertionError(f"no progress for {STALL_S}s with {ring.pending()} slots pending")
        time.sleep(RETRY_S)
    return True


def produce(
    ring: Ring,
    sc: Scenario,
    notify: Callable[[int], None],
    start: Callable[[], None],
    gave_up: Callable[[], bool] = lambda: False,
) -> int:
    """Write every message in batches, retrying while the ring is full; returns the full events.

    `notify(n)` follows each write that published n messages (the doorbell). `start()` runs
    once, at the first full ring or sync (or at the end), so the consumer starts on a full
    ring. Every `sync_every`-th write waits for the consumer to drain the ring: its doorbell is
    then the only thing that can wake the consumer, so a lost one shows."""
    msgs = [sc.message(i) for i in range(len(sc.lengths))]
    i = writes = full = 0
    started = False
    last = time.monotonic()
    while i < len(msgs) and not gave_up():
        batch = msgs[i : i + sc.batches[writes % len(sc.batches)]]
        n = int(ring.try_write(*batch[0])) if len(batch) == 1 else ring.write_many(batch)
        i += n
        writes += 1
        if n:
            notify(n)
            last = time.monotonic()
        short = n < len(batch)
        full += short
        if not short and not (n and sc.sync_every and writes % sc.sync_every == 0):
            continue
        if not started:
            start()
            started = True
        if not short and not drained(ring, gave_up):
            break
        if time.monotonic() - last > STALL_S:
            raise AssertionError(f"producer stalled at message {i} of {len(msgs)}")
        if short:
            time.sleep(RETRY_S)
    if not started:
        start()
    return full


def consume(
    ring: Ring, sc: Scenario, wait: Callable[[float], bool], took: Callable[[int], None]
) -> dict[str, Any]:
    """Read and check every message, sleeping through `wait(timeout)` while the ring is empty;
    stops at the first error."""
    got = woken = timeouts = 0
    errors: list[str] = []
    last = time.monotonic()
    while got < len(sc.lengths) and not errors:
        msgs = ring.read(sc.read_limit)
        if msgs:
            errors += [e for j, m in enumerate(msgs) if (e := check(sc, got + j, m))]
            got += len(msgs)
            took(len(msgs))
            last = time.monotonic()
        elif wait(sc.wait_s):
            woken += 1
        else:
            timeouts += 1
            if ring.pending() and not sc.big:  # published, so signalled, yet no wake-up came
                errors.append(f"lost wake-up: {ring.pending()} slots pending after {sc.wait_s}s")
            if time.monotonic() - last > STALL_S:
                errors.append(f"consumer stalled at message {got}")
    errors += [f"{n} slots left unread" for n in [ring.pending()] if n and not errors]
    return {"got": got, "errors": errors, "woken": woken, "timeouts": timeouts}


def semaphore_side(doorbell: Any) -> tuple[Callable[[float], bool], Callable[[int], None]]:
    """The worker's way: one post per message, taken back per message read (process/intake.py)."""

    def took(n: int) -> None:
        for _ in range(n):
            if not doorbell.acquire(False):
                break

    return (lambda timeout: bool(doorbell.acquire(True, timeout))), took


def eventfd_wait(efd: EventFd) -> Callable[[float], bool]:
    """The front-end's way: wake on the eventfd, drain it whole, then read the ring."""

    def wait(timeout: float) -> bool:
        ready, _, _ = select.select([efd.fd], [], [], timeout)
        if ready:
            efd.drain()
        return bool(ready)

    return wait


def peer_main(conn: Any, doorbell: Any, efd: EventFd) -> None:
    """The child: plays one side of each scenario it is sent, until told to stop."""
    wait, took = semaphore_side(doorbell)
    while (cmd := conn.recv())[0] != "stop":
        role, name, sc = cmd
        seg = Segment.attach(name)
        ring = Ring(seg)
        try:
            if role == "consume":
                report = consume(ring, sc, wait, took)
            else:
                on_full = functools.partial(conn.send, ("filled", {}))
                report = {"full": produce(ring, sc, lambda n: efd.ring(), on_full)}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            report = {"exception": repr(exc)}
        finally:
            ring.close()
            seg.close()
        conn.send(("done", report))


# -- the test process's side ---------------------------------------------------------------------
class Peer:
    """The spawned child, its doorbells and its command pipe; respawned after a failed example."""

    def __init__(self) -> None:
        bells = Doorbells()  # the pair a worker gets: request semaphore, answer eventfd
        self.doorbell = bells.request
        self.efd = bells.answer
        self.proc: Any = None
        self.conn: Any = None
        self.spawn()

    def spawn(self) -> None:
        self.conn, child_conn = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=peer_main, args=(child_conn, self.doorbell, self.efd))
        self.proc.start()
        child_conn.close()

    def expect(self, kind: str) -> dict[str, Any]:
        assert self.conn.poll(STALL_S + 10), f"peer sent no {kind!r}"
        got, report = self.conn.recv()
        assert "exception" not in report, report["exception"]
        assert got == kind, (got, report)
        return dict(report)

    @contextlib.contextmanager
    def example(self) -> Iterator[None]:
        """Leave no state behind: doorbells drained, and a fresh child if the example failed."""
        try:
            yield
        except BaseException:
            self.proc.kill()
            self.proc.join()
            self.conn.close()
            self.spawn()
            raise
        finally:
            while self.doorbell.acquire(False):
                pass  # posts taken back late by the worker-style consumer
            self.efd.drain()

    def stop(self) -> None:
        self.conn.send(("stop",))
        self.proc.join(30)
        assert self.proc.exitcode == 0
        self.efd.close()


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.stop()


@pytest.fixture(autouse=True)
def no_leftover_segments() -> Iterator[None]:
    yield
    assert list_segments(PID) == []


def settle(
    seg: Segment, ring: Ring, sc: Scenario, report: dict[str, Any], seen: Counter[str]
) -> None:
    """The checks after every example; what it exercised is tallied into `seen`."""
    assert report["errors"] == [], report["errors"]
    assert report["got"] == len(sc.lengths)
    assert os.path.exists(os.path.join(segment_mod.SHM_DIR, seg.name)), "the child unlinked it"
    assert ring.pending() == 0
    used = tail_of(ring) - sc.start
    pad = used - sum(sc.need(n) for n in sc.lengths)
    assert pad >= 0
    seen.update(
        synced=bool(sc.sync_every),
        timeouts=report["timeouts"],
        woken=report["woken"],
        pad=pad,
        wraps=used // sc.slot_count,
        big=sc.big,
        multi=any(sc.need(n) > 1 for n in sc.lengths),
    )


@st.composite
def scenarios(draw: Any) -> Scenario:
    slot_size = draw(st.sampled_from([64, 128, 256]))
    slot_count = draw(st.sampled_from([8, 16]))
    top = slot_size * slot_count - L.RECORD_SIZE  # max_payload
    one = slot_size - L.RECORD_SIZE
    half = slot_size * (slot_count // 2) - L.RECORD_SIZE
    length = st.one_of(
        st.integers(0, one),
        st.integers(0, draw(st.sampled_from([half, top]))),
        st.sampled_from([0, 3, 4, one, one + 1, half, half + 1, top - 1, top]),
    )
    return Scenario(
        slot_size=slot_size,
        slot_count=slot_count,
        start=draw(st.one_of(st.just(0), st.integers(0, 1 << 62))),
        first_id=draw(st.integers(0, (1 << 64) - 100)),
        lengths=tuple(draw(st.lists(length, min_size=1, max_size=40))),
        batches=tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))),
        read_limit=draw(st.sampled_from([1, 2, 3, 1 << 30])),
        sync_every=draw(st.sampled_from([0, 0, 1, 3])),
    )


# Always run: many multi-slot messages in a tiny ring (full ring, PADs), whole-ring ones, and
# a consumer that sleeps between every write.
SMALL_RING = Scenario(64, 8, 5, 1, (100, 0, 31, 33, 200, 64, 1, 150) * 3, (3, 1, 2), 2)
LOCKSTEP = Scenario(64, 16, 9, 77, (10, 40, 0, 90, 300) * 4, (1, 2), 1 << 30, sync_every=1)
WHOLE_RING = Scenario(128, 8, 3, (1 << 64) - 50, (992, 0, 991, 500, 992, 7), (2, 1), 1 << 30)


def test_request_direction_semaphore(peer: Peer) -> None:
    """Test process produces, the child consumes and sleeps on the semaphore when empty."""
    seen: Counter[str] = Counter()

    @TWO_PROCESS
    @given(sc=scenarios())
    @example(sc=SMALL_RING)
    @example(sc=WHOLE_RING)
    @example(sc=LOCKSTEP)
    def run(sc: Scenario) -> None:
        with peer.example(), scenario_ring(sc) as (seg, ring):
            release = peer.doorbell.release

            def post(n: int) -> None:
                for _ in range(n):
                    release()

            start = functools.partial(peer.conn.send, ("consume", seg.name, sc))
            seen["full"] += produce(ring, sc, post, start, peer.conn.poll)
            settle(seg, ring, sc, peer.expect("done"), seen)

    run()
    assert all(seen[k] for k in ("full", "pad", "wraps", "woken", "big", "multi", "synced")), seen


def test_response_direction_eventfd(peer: Peer) -> None:
    """The child produces and rings the eventfd once per write; the test process consumes."""
    seen: Counter[str] = Counter()
    wait = eventfd_wait(peer.efd)

    @TWO_PROCESS
    @given(sc=scenarios())
    @example(sc=SMALL_RING)
    @example(sc=WHOLE_RING)
    @example(sc=LOCKSTEP)
    def run(sc: Scenario) -> None:
        with peer.example(), scenario_ring(sc) as (seg, ring):
            peer.conn.send(("produce", seg.name, sc))
            peer.expect("filled")
            report = consume(ring, sc, wait, lambda n: None)
            assert report["errors"] == [], report["errors"]  # before waiting on a stuck child
            seen["full"] += peer.expect("done")["full"]
            settle(seg, ring, sc, report, seen)

    run()
    assert all(seen[k] for k in ("full", "pad", "wraps", "woken", "big", "multi", "synced")), seen


# -- segments ------------------------------------------------------------------------------------
# Each child writes a byte, closes its mapping and exits; its resource tracker (if any) then runs.
ATTACH = (
    "from ringserve.shm.segment import Segment as S; s = S.attach(NAME); s.buf[0] = 7; s.close()"
)
RAW_ATTACH = "from multiprocessing.shared_memory import SharedMemory as M; M(NAME).close()"


def attach_in_child(code: str, name: str) -> None:
    cmd = [sys.executable, "-c", code.replace("NAME", repr(name))]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=60)


def test_attach_does_not_let_the_child_unlink() -> None:
    seg = new_segment(4096)
    try:
        attach_in_child(ATTACH, seg.name)
        assert os.path.exists(os.path.join(segment_mod.SHM_DIR, seg.name))
        assert seg.buf[0] == 7
    finally:
        seg.close()
        seg.unlink()


def test_plain_attach_would_unlink() -> None:
    """The hazard that Segment.attach avoids is real on this Python (so the test above bites)."""
    seg = new_segment(4096)
    try:
        attach_in_child(RAW_ATTACH, seg.name)
        gone = not os.path.exists(os.path.join(segment_mod.SHM_DIR, seg.name))
    finally:
        seg.close()
        seg.unlink()
    assert gone
    # Our own tracker still lists it (unlink failed before unregistering): keep it quiet at exit.
    resource_tracker.unregister("/" + seg.name, "shared_memory")


def test_remove_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a private directory: /dev/shm holds other people's segments, which are not ours."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead, live = child.pid, os.getppid()
    never = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    names = [
        segment_name(dead, 1, "req"),
        segment_name(never, 0, "ctl"),
        segment_name(PID, 1, "req"),
        segment_name(live, 2, "rsp"),
        "rs_notapid_1_req",
        "other_123_req",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(segment_mod, "SHM_DIR", str(tmp_path))
    assert sorted(remove_stale(keep_pid=never)) == [names[0]]
    assert sorted(remove_stale()) == [names[1]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
