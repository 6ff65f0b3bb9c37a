"""Watching the workers: on each tick a stale heartbeat, a boot that never ends, a stop that
is not obeyed (TERM, then KILL) and a worker past the RSS limit; and at the end, stopping them
all. What to do about a failed worker is the supervisor's: it is told through `failed` and
`recycle`."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Iterable

from ringserve.service.config.settings import Config
from ringserve.service.pool.handle import WorkerHandle

RSS_EVERY_S = 0.5  # /proc reads for the RSS limit: a leak is slow, the heartbeat tick is not
KILL_AFTER_S = 3.0  # TERM, then KILL when a stopping worker has not left by then
BOOT_TIMEOUT_S = 180.0  # a worker that has not loaded by then is killed and replaced
EXIT_STATUS_WAIT_S = 1.0  # longest wait for a gone worker's exit status (see exit_pending)


def escalate(handle: WorkerHandle, now: float, after: float = KILL_AFTER_S) -> None:
    """KILL a worker that was asked to stop more than `after` seconds ago and is still here."""
    if handle.kill_sent_at and now - handle.kill_sent_at > after:
        handle.signal(signal.SIGKILL)


class Watch:
    def __init__(
        self,
        settings: Config,
        failed: Callable[[WorkerHandle, str], None],
        recycle: Callable[[int, str], object],
        emit: Callable[..., None],
    ) -> None:
        self.heartbeat_ms = settings.heartbeat_timeout_s * 1000
        self.max_rss = settings.worker_max_rss
        self.failed = failed  # declare it dead: reroute what it held, replace it
        self.recycle = recycle  # restart its slot (Supervisor.restart)
        self.emit = emit
        self.rss_checked_at = 0.0
        self.exit_seen: dict[int, float] = {}  # serial -> when its sentinel first fired

    def check(self, handles: Iterable[WorkerHandle], now: float) -> None:
        rss_due = now - self.rss_checked_at >= RSS_EVERY_S
        if rss_due:
            self.rss_checked_at = now
        for handle in list(handles):
            if not handle.dead and self._failed(handle, now):
                continue
            escalate(handle, now)
            if rss_due and not handle.dead:
                self._check_rss(handle)

    def _failed(self, handle: WorkerHandle, now: float) -> bool:
        """A loaded worker whose heartbeat is stale, or one that never finished loading."""
        if not handle.loaded():
            if now - handle.started_at <= BOOT_TIMEOUT_S:
                return False
            self.failed(handle, "boot timeout")
            return True
        if handle.ready_at is None:  # loaded but its first doorbell not seen yet
            handle.ready_at = now
        age = handle.ctl.heartbeat_age_ms()
        if age is None or age <= self.heartbeat_ms:
            return False
        self.emit("worker_hung", level=logging.WARNING, worker=handle.slot, pid=handle.pid,
                  heartbeat_age_ms=round(age))  # fmt: skip
        self.failed(handle, "heartbeat stale")
        return True

    def _check_rss(self, handle: WorkerHandle) -> None:
        limit = self.max_rss
        if not limit or handle.draining or handle.slot is None:
            return
        rss = handle.rss_bytes()
        if rss > limit:
            self.emit("worker_recycle", level=logging.WARNING, worker=handle.slot,
                      pid=handle.pid, rss_bytes=rss, limit=limit)  # fmt: skip
            self.recycle(handle.slot, "rss limit")

    def exit_pending(self, handle: WorkerHandle) -> bool:
        """Reap a gone worker; whether its exit status may still come: a forked one killed
        before it was re-parented here is the middle process's child for a moment, so waitpid
        finds nothing yet. Waited for up to EXIT_STATUS_WAIT_S (wall time: the kernel's, not the
        supervisor's clock), so a SIGKILL is reported as -9 rather than as no code at all."""
        if handle.reap() is not None:
            self.exit_seen.pop(handle.serial, None)
            return False
        now = time.monotonic()
        first = self.exit_seen.setdefault(handle.serial, now)
        if now - first < EXIT_STATUS_WAIT_S:
            return True
        self.exit_seen.pop(handle.serial, None)
        return False


async def stop_all(handles: list[WorkerHandle], now: float, timeout: float) -> None:
    """TERM every worker, KILL what is left after KILL_AFTER_S (or `timeout`, if shorter) and
    everything at `timeout`; return once every one has exited."""
    for h in handles:
        h.drain()
        h.terminate(now)
    deadline = time.monotonic() + timeout
    while any(h.process.exitcode is None for h in handles if h.pid is not None):
        now = time.monotonic()
        for h in handles:
            escalate(h, now, min(KILL_AFTER_S, timeout))
        if now > deadline:
            for h in handles:
                h.signal(signal.SIGKILL)
        await asyncio.sleep(0.02)
        for h in handles:
            if h.pid is not None:
                h.process.join(0)
