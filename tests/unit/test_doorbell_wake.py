"""A post on a worker's request doorbell wakes one waiting lane, not every lane (issue 60: a
lone request's path). Real eventfds and real threads; no timing is asserted."""

from __future__ import annotations

import threading
import time

from ringserve.shm.doorbell import Semaphore

DEADLINE_S = 10.0


def wait_for(cond: object, what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, what
        time.sleep(0.001)


def sleeping_in_poll(tid: int) -> bool:
    """The thread sleeps in the kernel's poll, select or epoll wait (not on a lock)."""
    try:
        with open(f"/proc/self/task/{tid}/wchan") as f:
            where = f.read()
    except OSError:
        return False
    return "poll" in where or "select" in where


def switches(tid: int) -> int:
    """How many times the thread has gone to sleep (its voluntary context switches)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def test_one_post_wakes_one_waiter() -> None:
    """Two threads sleep on the doorbell; each post is taken by one of them, and the other is
    not woken for a post it cannot take (with select both woke, and one slept again)."""
    bell = Semaphore()
    results: list[bool] = []
    woke: list[int] = []
    asleep = threading.Barrier(3)

    def waiter() -> None:
        asleep.wait()
        results.append(bell.acquire(True, DEADLINE_S))
        woke.append(threading.get_native_id())

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        asleep.wait()
        for t in threads:
            wait_for(lambda t=t: sleeping_in_poll(t.native_id), "a waiter sleeps on the bell")
        before = {t.native_id: switches(t.native_id) for t in threads}
        bell.release()
        wait_for(lambda: woke, "a waiter took the first post")
        other = next(t.native_id for t in threads if t.native_id != woke[0])
        wait_for(lambda: sleeping_in_poll(other), "the other waiter sleeps on")
        assert switches(other) == before[other], "the other waiter woke for a post it lost"
        bell.release()
        wait_for(lambda: len(results) == 2, "the other waiter took the second post")
        assert results == [True, True]
    finally:
        bell.release(2)  # whatever still waits returns
        for t in threads:
            t.join(DEADLINE_S)
        bell.close()


def test_posts_made_before_the_wait_are_taken_at_once() -> None:
    """A post left in the count (the worker was busy when it came) is taken without sleeping,
    and a wait with nothing posted times out empty."""
    bell = Semaphore()
    try:
        bell.release(2)
        assert bell.acquire(True, DEADLINE_S)
        assert bell.acquire(False)
        assert not bell.acquire(False)
        assert not bell.acquire(True, 0.01)
    finally:
        bell.close()
