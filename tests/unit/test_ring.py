"""The SPSC ring between two real processes over real shared memory, and its edge cases in-process.

The two-process tests spawn one peer child per module that serves many hypothesis examples: for
each example the test process creates a fresh ring segment, tells the child its role (consume
or produce) and the scenario over a pipe, and plays the other side. Every message's payload is
derived from its id and ends in a crc, so loss, duplication, reordering and corruption all show.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing
import os
import random
import select
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
from ringserve.shm.ring import Ring, RingError
from ringserve.shm.segment import Segment, list_segments, remove_stale, segment_name

ROOT = Path(__file__).resolve().parents[2]
SPAWN = multiprocessing.get_context("spawn")
PID = os.getpid()
_serial = itertools.count(1)

WAIT_LONG_S = 2.0  # a safety net only: a wait that times out with messages pending = lost wake-up
WAIT_SHORT_S = 0.005  # big messages: a lone PAD is seen at the consumer's next look (see Ring)
RETRY_S = 0.0005  # producer's pause when the ring is full
STALL_S = 20.0  # no progress for this long is a deadlock, not a slow machine
TWO_PROCESS = settings(max_examples=25, deadline=None)


# -- messages ------------------------------------------------------------------------------------
def payload_for(msg_id: int, length: int) -> bytes:
    """Bytes that only this id gives, ending in the crc32 of the rest when there is room."""
    if length < 4:
        return msg_id.to_bytes(8, "little")[:length]
    body = random.Random(msg_id).randbytes(length - 4)
    return body + zlib.crc32(body).to_bytes(4, "little")


def aux_for(msg_id: int) -> int:
    return (msg_id * 0x9E3779B97F4A7C15) % (1 << 64) - (1 << 63)  # spans the whole i64 range


@dataclass(frozen=True)
class Scenario:
    slot_size: int
    slot_count: int
    start: int  # the head and tail counters before the first message
    first_id: int
    lengths: tuple[int, ...]
    batches: tuple[int, ...]  # write_many sizes, cycled (1 goes through try_write)
    read_limit: int
    sync_every: int = 0  # every n-th write waits for the consumer to drain the ring (0: never)

    @property
    def big(self) -> bool:
        """A message of more than half the ring may wait on a lone PAD (see Ring.write_many)."""
        return any(self.need(n) > self.slot_count // 2 for n in self.lengths)

    @property
    def wait_s(self) -> float:
        return WAIT_SHORT_S if self.big else WAIT_LONG_S

    def need(self, length: int) -> int:
        return L.slots_for(length, self.slot_size)

    def message(self, i: int) -> tuple[int, bytes, int]:
        msg_id = self.first_id + i
        return msg_id, payload_for(msg_id, self.lengths[i]), aux_for(msg_id)


def check(sc: Scenario, index: int, msg: tuple[int, int, bytes]) -> str | None:
    """What is wrong with the `index`-th message received, or None."""
    msg_id, aux, payload = msg
    if index >= len(sc.lengths):
        return f"unexpected extra message {msg_id}"
    want_id, want_payload, want_aux = sc.message(index)
    if msg_id != want_id:
        return f"message {index}: id {msg_id}, expected {want_id}"
    if len(payload) >= 4 and zlib.crc32(payload[:-4]) != int.from_bytes(payload[-4:], "little"):
        return f"message {msg_id}: crc mismatch"
    if payload != want_payload or aux != want_aux:
        return f"message {msg_id}: payload or aux differs"
    return None


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
    """The worker's way: one post per message, taken back per message read (workers/worker.py)."""

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


def new_segment(size: int) -> Segment:
    return Segment.create(segment_name(PID, next(_serial), "test"), size)


def tail_of(ring: Ring) -> int:
    return int(ring._words[L.TAIL_OFFSET // 8])


def set_counters(seg: Segment, head: int, tail: int) -> None:
    words = seg.buf[: L.SLOTS_OFFSET].cast("q")
    words[L.HEAD_OFFSET // 8] = head
    words[L.TAIL_OFFSET // 8] = tail
    words.release()


@contextlib.contextmanager
def scenario_ring(sc: Scenario) -> Iterator[tuple[Segment, Ring]]:
    seg = new_segment(L.ring_bytes(sc.slot_size, sc.slot_count))
    Ring(seg, sc.slot_size, sc.slot_count).close()
    set_counters(seg, sc.start, sc.start)
    ring = Ring(seg)
    try:
        yield seg, ring
    finally:
        ring.close()
        seg.close()
        seg.unlink()


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
    names = ("msg_id", "aux", "length", "flags", "nslots", "reserved")
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
        assert ring.write_many([(1, b"a" * 20, 0), (2, b"b" * 20, 0)]) == 2  # slots 7 and 0
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
        assert ring.read() == [(2, 0, payload_for(2, top))]
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
        msg = (9, payload_for(9, need * 64 - L.RECORD_SIZE), -1)
        if start + need > 8 and need > start:
            assert ring.write_many([msg]) == 0
            assert ring.pending() == 8 - start  # the PAD alone
            assert ring.read() == []
        assert ring.write_many([msg]) == 1
        assert ring.read() == [(9, -1, msg[1])]


def test_too_big_publishes_nothing_anywhere() -> None:
    with local_ring(64, 8, start=5) as ring:
        assert ring.write_many([(1, bytes(ring.max_payload() + 1), 0), (2, b"x", 0)]) == 0
        assert tail_of(ring) == 5 and ring.pending() == 0


def test_write_many_partial_keeps_order() -> None:
    with local_ring(64, 8) as ring:
        msgs = [(i, payload_for(i, 20), -i) for i in range(12)]
        assert ring.write_many(msgs) == 8
        assert [m[0] for m in ring.read(3)] == [0, 1, 2]
        assert ring.write_many(msgs[8:]) == 3
        assert ring.read() == [(i, -i, payload_for(i, 20)) for i in range(3, 11)]


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
            assert ring.read() == [(i, 0, payload_for(i, length))]
        assert used >= 300 and tail_of(ring) == start + used
        assert ring._words[L.HEAD_OFFSET // 8] == tail_of(ring)  # far past slot_count


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
        assert ring.write_many([(7, payload, word), (8, payload, 0)]) == 2
        assert tail_of(ring) == 2
        (_, aux, got), (_, no_batch, _) = ring.read()
    assert got == payload and no_batch == 0
    assert L.unpack_batch(aux, start + 10**6) == (3000, 128, start)
    assert L.unpack_batch(0, start) == (0, 0, 0)
