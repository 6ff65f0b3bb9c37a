"""Doorbells: an eventfd in semaphore mode wakes a worker, a plain eventfd wakes the front-end.

The request doorbell is posted once per published request. A worker that finds its ring empty
waits on it; a post made after the worker's last look leaves the count above zero, so the wait
returns at once and no wake-up is lost (no "asleep" flag, no fence needed). It is an eventfd
with EFD_SEMAPHORE (each read takes one from the count), not a POSIX named semaphore: a file
descriptor has no name in /dev/shm, so a killed server cannot leave one behind. The lanes of a
worker (workers/process/lanes.py) all wait on its one doorbell, each in an epoll of its own
holding the eventfd with EPOLLEXCLUSIVE, so a post wakes one sleeping lane: with select every
lane woke for each post and all but one slept again, a wake-up on the other core in the middle
of a lone request's path (docs/design.md, "A lone request"). A lane that leaves texts waiting
posts again, so a busy worker still wakes a second lane.

The response doorbell is an eventfd written once per batch of answers. The front-end watches it
with loop.add_reader and reads it (which resets it to zero) before draining the ring; an answer
published after that read writes the eventfd again, so none waits unseen.

Both travel to a worker as file descriptors: through the spawn machinery (pass_fds) while a
spawn-started worker is being started, or by SCM_RIGHTS to the zygote (workers/process/zygote.py).
"""

from __future__ import annotations

import os
import select
import threading
from multiprocessing import reduction
from typing import Any

_ONE = (1).to_bytes(8, "little")


class EventFd:
    """A non-blocking eventfd; picklable to a spawn-started child while it is being started."""

    FLAGS = os.EFD_NONBLOCK | os.EFD_CLOEXEC

    def __init__(self, fd: int | None = None) -> None:
        self.fd = fd if fd is not None else os.eventfd(0, self.FLAGS)

    def ring(self) -> None:
        try:
            os.write(self.fd, _ONE)
        except BlockingIOError:  # counter saturated: the reader is already due to wake
            pass

    def drain(self) -> int:
        try:
            return int.from_bytes(os.read(self.fd, 8), "little")
        except BlockingIOError:
            return 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Only valid while spawning: the fd is handed to the child through pass_fds.
        return (_rebuild, (type(self), reduction.DupFd(self.fd)))


class Semaphore(EventFd):
    """A counting semaphore on an eventfd (EFD_SEMAPHORE): release adds n, acquire takes one.

    Same calls as multiprocessing's Semaphore, so the worker's loop reads the same."""

    FLAGS = os.EFD_NONBLOCK | os.EFD_CLOEXEC | os.EFD_SEMAPHORE

    def __init__(self, fd: int | None = None) -> None:
        super().__init__(fd)
        self._own = threading.local()  # each waiting thread's epoll (_sleep)
        self._epolls: list[select.epoll] = []

    def _sleep(self, timeout: float | None) -> bool:
        """Wait until the count may be above zero (or `timeout`): True when woken. Each thread
        waits in an epoll of its own that holds the eventfd with EPOLLEXCLUSIVE, so a post
        wakes one waiting thread, not all (the lanes of a worker wait on one doorbell)."""
        ep = getattr(self._own, "epoll", None)
        if ep is None:
            ep = self._own.epoll = select.epoll()
            ep.register(self.fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)
            self._epolls.append(ep)
        return bool(ep.poll(-1 if timeout is None else timeout, 1))

    def close(self) -> None:
        for ep in self._epolls:
            ep.close()
        self._epolls.clear()
        super().close()

    def release(self, n: int = 1) -> None:
        try:
            os.write(self.fd, n.to_bytes(8, "little"))
        except BlockingIOError:  # 2**64-2 posts outstanding: cannot happen with bounded rings
            pass

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        try:
            os.read(self.fd, 8)
            return True
        except BlockingIOError:
            if not block:
                return False
        if not self._sleep(timeout):
            return False
        try:
            os.read(self.fd, 8)
            return True
        except BlockingIOError:  # another waiter took it first
            return False


def _rebuild(cls: type[EventFd], dup: Any) -> EventFd:
    return cls(dup.detach())
