"""The worker process: attach rings, load its models, then run the serving loop.

Started with spawn, or forked from the zygote (workers/process/zygote.py), which hands over the
imports (torch and the CPU weights too, for TorchScript workers) already loaded. Everything that
creates threads or device state (thread count, CUDA, the runtime's warm-up) happens here, in
the child, either way. The heartbeat is stamped by the serving loop itself, so a stuck batch
shows.

The worker's rooms, each in a module of its own:
- intake.py: the request ring read into the models' batchers (and what is refused at once);
- answers.py: runner output packed into the response ring, and the answer doorbell;
- models.py: the model set (loading, turns, expiry), built on served.py;
- lanes.py: the lanes' threads and their pinning;
- behind.py: the background batch of a model owed to a lighter one;
- this module: boot and the one serving loop, run by every lane.

The loop, in each lane: under the worker's lock, stamp the heartbeat, check the parent, take
what was posted, expire what is late, pick the model whose turn it is and take its batch; then
fill and run that batch outside the lock (or hand it to the background thread), and answer it
under the lock. With one lane the lock is never contended.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from ringserve.shm import layout as L
from ringserve.shm.channel import Channel
from ringserve.workers.process.answers import Answers, Running, forward_batch
from ringserve.workers.process.behind import Behind
from ringserve.workers.process.intake import Intake
from ringserve.workers.process.lanes import Lanes
from ringserve.workers.process.models import ModelSet
from ringserve.workers.process.served import Preloaded
from ringserve.workers.process.trim import Trim
from ringserve.workers.spec import (
    EXIT_BOOT_ERROR,
    EXIT_DEVICE_ERROR,
    EXIT_OK,
    EXIT_PARENT_GONE,
    STOP_SIGNAL,
    WorkerSpec,
    ignore_group_signals,
)
from ringserve.workers.testhooks import HOOKS

_PR_SET_PDEATHSIG = 1
Pick = tuple[int, Running | None, int]  # requests taken, the batch to run, ns until one is due


class Worker:
    """One worker process's rooms, and the serving loop that runs them."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.stop = False
        self.ended: int | None = None  # the exit code a lane decided on
        self.channel = Channel.attach(spec.channel)
        self.ctl = self.channel.ctl
        self.ctl.set("pid", os.getpid())
        self.ctl.set("state", L.W_STARTING)
        self.ctl.beat()
        self.lock = threading.Lock()  # what the lanes share: the rings, batchers, answers
        self.lanes = Lanes(spec.lanes, spec.threads)
        self.models = ModelSet(spec, self.ctl, self.channel.responses.max_payload())
        self.behind = Behind(spec.doorbell.release)
        self.answers = Answers(spec, self.channel.responses, self.ctl, self.beat)
        self.intake = Intake(spec, self.channel.requests, self.ctl, self.models.served,
                             self.answers)  # fmt: skip
        self.trim = Trim(m.model_dir for m in spec.refs())  # memory given back once idle
        self.grow: list[bytes] = []  # test-only memory growth hook

    def boot(self, preloaded: dict[str, Preloaded] | None = None) -> None:
        """Load every model, then say ready."""
        self.models.load(preloaded)
        if self.lanes.many and all(len(s.runners) == 1 for s in self.models.served.values()):
            self.lanes = Lanes(1, self.spec.threads * self.lanes.count)  # OpenVINO: one loop
        self.models.ready()
        self.ctl.beat()
        self.spec.eventfd.ring()  # tells the supervisor at once, without waiting for its tick

    def beat(self) -> None:
        """Stamp the heartbeat; a batch still running (a lane's, or the one behind) holds it
        at that batch's start."""
        self.lanes.beat(self.ctl, self.behind.started_ns())

    # -- the serving loop ---------------------------------------------------------------------
    def serve(self) -> int:
        """Run the serving loop on every lane; returns once each lane has answered the batch
        it ran when the stop came."""
        try:
            self.lanes.run(self.loop, self.halt)
            if self.behind.busy:  # stopping: its texts are answered first
                self.answer(*self.behind.finish())
        finally:
            self.behind.shutdown()
        return self.ended if self.ended is not None else EXIT_OK

    def halt(self) -> None:
        self.stop = True

    def loop(self, k: int) -> None:
        """Lane k's serving loop."""
        mine: set[int] = set()
        while True:
            mine = self.lanes.pin(k, mine)
            with self.lock:
                if self.stop or self.ended is not None:
                    return
                took, run, wait_ns = self.pick(k)
                if self.ended is not None:  # the parent is gone
                    return
            if run is not None:
                self.run(k, run)
            elif not took:
                self.intake.wait(wait_ns)

    def pick(self, k: int) -> Pick:
        """One pass under the lock: beat, check the parent, take what was posted, expire what
        is late, and take the next batch of the model whose turn it is."""
        if self.behind.done():
            self.answer(*self.behind.finish())
        self.beat()
        if os.getppid() != self.spec.parent_pid:
            self.ended = EXIT_PARENT_GONE
            return 0, None, -1
        self.models.tick()
        took = self.intake.take_posted()
        now = time.monotonic_ns()
        self.answers.expired(self.models.expire(now))
        index, wait_ns = self.models.turns.next(now, self.behind.busy)
        if index is None:
            self.trim.idle(now, self.behind.busy or any(self.lanes.started_ns))
            return took, None, wait_ns
        served = self.models.served[index]
        batch, length = served.batcher.take()
        if not batch:
            return took, None, wait_ns
        self.lanes.started_ns[k] = now
        self.trim.ran(now)
        if self.lanes.many and served.batcher.size:  # texts left: wake a lane that sleeps
            self.spec.doorbell.release()
        return took, Running(served, batch, length), wait_ns

    def run(self, k: int, run: Running) -> None:
        """Fill lane k's buffers and run the batch outside the lock, then answer it (or hand
        it to the background thread when its model is owed to a lighter one)."""
        maybe_grow(self.grow)
        runner = run.served.runners[k] if self.lanes.many else run.served.runner
        run.tokens = runner.fill(run.length, run.batch)
        if self.lanes.many and hasattr(runner, "alone"):  # one text, the other lanes idle:
            others = any(t for j, t in enumerate(self.lanes.started_ns) if j != k)
            runner.alone = len(run.batch) == 1 and not others  # every core is its (--lone-cores)
        run.t0 = time.monotonic_ns()
        if self.models.turns.owes(run.served.ref.index):
            with self.lock:
                self.lanes.started_ns[k] = 0
                self.behind.start(run, runner)
            return
        probs = forward_batch(runner, run)
        t1 = time.monotonic_ns()
        with self.lock:
            self.lanes.started_ns[k] = 0
            self.answer(run, probs, t1)

    def answer(self, run: Running, probs: Any, t1: int) -> None:
        self.answers.batch(run, t1, probs)

    def close(self) -> None:
        """Drop every view into the segments, then the mappings (the front-end unlinks)."""
        self.channel.close()


def maybe_grow(grown: list[bytes]) -> None:
    """The test hooks (workers/testhooks.py) a batch obeys."""
    step = HOOKS.grow_bytes_per_batch
    if step:  # test-only: a leak for the supervisor's RSS limit to catch
        grown.append(b"\x01" * step)
    if HOOKS.batch_delay_ms:  # test-only: a slow batch, to hold a text between batches
        time.sleep(HOOKS.batch_delay_ms / 1000)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the loop's getppid check still catches a dead parent


def main(spec: WorkerSpec, preloaded: dict[str, Preloaded] | None = None) -> None:
    """The worker's life; `preloaded`: what the zygote loaded, by model directory, when forked
    from it."""
    _die_with_parent()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA indices = the front-end's NVML ones
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, spec.cpus)
    worker = Worker(spec)

    def on_stop(signum: int, frame: Any) -> None:
        worker.stop = True

    ignore_group_signals()  # the front-end decides (workers.spec)
    signal.signal(STOP_SIGNAL, on_stop)
    try:
        worker.boot(preloaded)
    except Exception as exc:  # noqa: BLE001 - any boot failure is reported the same way
        boot_failed(worker, exc)
    code = worker.serve()
    worker.ctl.set("state", L.W_EXITING)
    worker.close()
    sys.exit(code)


def boot_failed(worker: Worker, exc: Exception) -> None:
    """Say why the worker cannot start, and exit with the code that tells the device's fault
    from the model's."""
    spec, loader = worker.spec, worker.models.loader
    device_fault = loader.model_ok and spec.device != "cpu"
    what = f"cannot start on {spec.device}" if device_fault else "cannot load the model"
    if loader.current is not None:
        what += f" at {loader.current.model_dir}"
    print(f"ringserve worker {spec.serial}: {what}: {exc}", file=sys.stderr)
    traceback.print_exc()
    worker.ctl.set("state", L.W_EXITING)
    worker.close()
    sys.exit(EXIT_DEVICE_ERROR if device_fault else EXIT_BOOT_ERROR)
