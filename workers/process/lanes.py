"""Lanes and pinning. A worker of several lanes (spec.lanes, on ONNX Runtime, one model) runs
the one serving loop on a thread per lane, each pinned to its own core with its own buffers
and the one session (or compiled model) the lanes share: the texts of both cores wait in one
pool and form fuller batches than two workers' halves (docs/design.md, "A lane per core").
A worker of one lane runs the loop on its main thread."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

from ringserve.shm.control import ControlBlock


class Lanes:
    """The worker's lanes: when each lane's running batch started (0: none), for the
    heartbeat, and their threads. A lane's failure stops every lane and is raised by run()."""

    def __init__(self, count: int, threads: int) -> None:
        self.count = count
        self.threads = threads  # CPUs a lane keeps
        self.started_ns = [0] * count
        self.failure: BaseException | None = None

    @property
    def many(self) -> bool:
        return self.count > 1

    def beat(self, ctl: ControlBlock, *others: int) -> None:
        """Stamp the heartbeat: now, or when the oldest batch still running started (a lane
        stuck in its batch stops the beat as one loop would); `others`: more such starts."""
        running = [t for t in (*self.started_ns, *others) if t]
        ctl.beat(min(running) if running else None)

    def run(self, loop: Callable[[int], None], stop: Callable[[], None]) -> None:
        """Run loop(k) for every lane, lane 0 on this thread (which takes the stop signal);
        returns once each lane has returned. `stop` ends the others when one fails."""
        if not self.many:
            loop(0)
            return
        others = [
            threading.Thread(target=self._lane, args=(loop, k, stop), name=f"lane-{k}", daemon=True)
            for k in range(1, self.count)
        ]
        for t in others:  # before lane 0 pins this thread: they inherit the worker's CPUs
            t.start()
        self._lane(loop, 0, stop)
        for t in others:
            t.join()
        if self.failure is not None:  # a lane's error is the worker's, as the loop's would be
            raise self.failure

    def _lane(self, loop: Callable[[int], None], k: int, stop: Callable[[], None]) -> None:
        try:
            loop(k)
        except BaseException as exc:  # noqa: BLE001 - handed to run(), which raises it
            if self.failure is None:
                self.failure = exc
            stop()

    def pin(self, k: int, mine: set[int]) -> set[int]:
        """Keep lane k on its own share of the worker's CPUs: the k-th `threads` of them. The
        front-end moves every thread of a spare onto its slot's CPUs when it takes the slot
        (service.pool.handle.pin), so a lane that finds its CPUs changed pins itself again.
        One lane keeps the worker's CPUs as they are."""
        if not self.many:
            return mine
        try:
            now = os.sched_getaffinity(0)  # this thread's own
        except (OSError, AttributeError):
            return mine
        if now == mine:
            return mine
        cpus, per = sorted(now), self.threads
        start = (k * per) % len(cpus)
        want = {cpus[(start + i) % len(cpus)] for i in range(per)}
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, want)
        return want
