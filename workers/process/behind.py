"""The background batch. Many models on the CPU: a model owed to a lighter one
(workers.process.served.Turns) runs its whole batches on a background thread of the worker,
at BEHIND_NICE (a thread may raise its own without privilege), while the loop goes on reading
and runs the lighter model's batches at once: the two threads share the worker's core, the
kernel giving the light batch about 90% of it (weights 1024 against 110), so a light text no
longer waits for the busy batch to end, and the busy model no longer runs cut batches for it.
benchmarks/many_models.py --phases r (5 rounds, 2 shared CPUs, 90/10 at c=32): light P99
pooled over the rounds 1.26x alone at nice 10 with (b)/(a) median 0.93; 1.28x and 0.92 at
nice 5; 1.87x at nice 0 (measured before a lost wake-up was fixed); against 1.81x and 0.94
with the eighth-cut batches before."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ringserve.workers.process.answers import Running, forward_batch

BEHIND_NICE = 10


class Behind:
    """At most one batch running on the background thread; `wake` is called once it is done
    (the worker's request doorbell, so a sleeping loop answers it)."""

    def __init__(self, wake: Any) -> None:
        self.wake = wake
        self.run: Running | None = None  # the batch running there
        self.runs = 0  # batches run there
        self._thread: ThreadPoolExecutor | None = None

    @property
    def busy(self) -> bool:
        return self.run is not None

    def started_ns(self) -> int:
        """When the batch running there started (0: none): the heartbeat waits for it."""
        return self.run.t0 if self.run is not None else 0

    def start(self, run: Running, runner: Any) -> None:
        """Run the batch's forward pass there (its rows are filled: run.t0 is set)."""
        if self._thread is None:  # started at its first batch, at BEHIND_NICE
            self._thread = ThreadPoolExecutor(1, "behind", initializer=_lower_priority)
        run.future = self._thread.submit(_forward, runner, run)
        # Rung once the future is done (not before: the loop must then see it done).
        run.future.add_done_callback(self._done)
        self.run = run
        self.runs += 1

    def done(self) -> bool:
        return self.run is not None and self.run.future is not None and self.run.future.done()

    def finish(self) -> tuple[Running, Any, int]:
        """The batch behind with its scores and end (waiting for it if it still runs); its
        error is the loop's."""
        run, self.run = self.run, None
        assert run is not None and run.future is not None
        probs, t1 = run.future.result()
        return run, probs, t1

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)

    def _done(self, future: Future[tuple[Any, int]]) -> None:
        self.wake()


def _forward(runner: Any, run: Running) -> tuple[Any, int]:
    """On the background thread: a batch's forward pass, and when it ended."""
    return forward_batch(runner, run), time.monotonic_ns()


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BEHIND_NICE)
