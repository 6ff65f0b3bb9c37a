"""Doorbells: a counting semaphore wakes a worker, an eventfd wakes the front-end's loop.

The request doorbell is posted once per published request. A worker that finds its ring empty
waits on it; a post made after the worker's last look leaves the count above zero, so the wait
returns at once and no wake-up is lost (no "asleep" flag, no fence needed).

The response doorbell is an eventfd written once per batch of answers. The front-end watches it
with loop.add_reader and reads it (which resets it to zero) before draining the ring; an answer
published after that read writes the eventfd again, so none waits unseen.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import reduction
from typing import Any

_ONE = (1).to_bytes(8, "little")


def request_doorbell() -> Any:
    """A POSIX semaphore that travels to a spawn-started worker as a Process argument."""
    return multiprocessing.get_context("spawn").Semaphore(0)


class EventFd:
    """A non-blocking eventfd; picklable to a spawn-started child while it is being started."""

    def __init__(self, fd: int | None = None) -> None:
        self.fd = fd if fd is not None else os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

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

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        # Only valid while spawning: the fd is handed to the child through pass_fds.
        return (_rebuild_eventfd, (reduction.DupFd(self.fd),))


def _rebuild_eventfd(dup: Any) -> EventFd:
    return EventFd(dup.detach())
