"""One worker process as the pool sees it: start, signal, reap, pin, RSS, and its state. Its
rings, doorbells and assigned requests are the engine's WorkerLink (service.engine.link),
which the handle makes and releases."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import time
from typing import Any

from ringserve.service.config.settings import Config
from ringserve.service.engine.link import WorkerLink
from ringserve.shm import layout as L
from ringserve.shm.channel import Channel, Doorbells, request_ring_slots, response_ring_slots
from ringserve.workers.process.zygote import Zygote
from ringserve.workers.spec import STOP_SIGNAL, ModelRef, WorkerSpec
from ringserve.workers.testhooks import HOOKS

SPAWN = multiprocessing.get_context("spawn")

# Front-end view of a worker (CONTRACT.md's states).
STARTING = "starting"
READY = "ready"
DEGRADED = "degraded"
DRAINING = "draining"
SPARE = "spare"
DEAD = "dead"


class ForkedProcess:
    """A worker forked by the zygote and re-parented to this process: the same calls as a
    multiprocessing Process (pid, sentinel, exitcode, join, close), on a pidfd and waitpid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sentinel = os.pidfd_open(pid)  # readable once the process has exited
        self._exitcode: int | None = None

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None:
            self.join(0)
        return self._exitcode

    def join(self, timeout: float | None = None) -> None:
        if self._exitcode is not None:
            return
        if timeout and not select.select([self.sentinel], [], [], timeout)[0]:
            return
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not re-parented to us yet (its middle process is exiting)
            return
        if pid:
            self._exitcode = os.waitstatus_to_exitcode(status)

    def close(self) -> None:
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


def pid_rss(pid: int | None) -> int:
    """A process's resident set in bytes (/proc/PID/statm), 0 when it is gone or unknown."""
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def worker_spec(
    settings: Config,
    serial: int,
    parent_pid: int,
    cpus: list[int],
    device: str,
    model_dir: str,
    bells: Doorbells,
    channel: Channel,
    models: tuple[ModelRef, ...] = (),
) -> WorkerSpec:
    """What the worker process is told at start (workers.spec): small and picklable."""
    return WorkerSpec(
        serial=serial,
        parent_pid=parent_pid,
        cpus=cpus,
        threads=settings.threads,
        lanes=settings.lane_count() if device == "cpu" else 1,
        lone_cores=settings.lone_cores,
        device=device,
        model_dir=model_dir,
        channel=channel.names,
        buckets=tuple(settings.buckets),
        max_batch=settings.batch_rows(device),
        max_delay_ms=settings.max_delay_ms,
        doorbell=bells.request,
        eventfd=bells.answer,
        precision=settings.precision,
        max_batch_tokens=settings.batch_tokens(device),
        runtime=settings.runtime,
        graph=settings.graph if settings.graph != "auto" else "plain",
        long_text=settings.long_text,
        window_stride=settings.window_stride,
        max_windows=settings.max_windows,
        bulk_max_wait_ms=settings.bulk_max_wait_ms,
        models=models,
    )


class WorkerHandle:
    """Owns one worker process, and the engine's link to it (`link`)."""

    def __init__(
        self,
        serial: int,
        cpus: list[int],
        device: str,
        model_dir: str,
        generation: int,
        settings: Config,
        models: tuple[ModelRef, ...] = (),
    ) -> None:
        pid = os.getpid()
        self.serial = serial
        self.generation = generation
        self.slot: int | None = None  # serving slot id, None while spare
        self.exitcode: int | None = None
        self.cpus = list(cpus)
        self.device = device
        self.started_at = time.monotonic()
        self.ready_at: float | None = None
        self.kill_sent_at: float | None = None
        self.forked = False
        self.link = WorkerLink.open(
            pid,
            serial,
            request_ring_slots(settings.max_body, settings.max_frame, settings.ring_slots),
            response_ring_slots(settings.ring_slots, settings.max_queue),
            frozenset(m.index for m in models) or frozenset({0}),
            HOOKS.predictable_segments,
        )
        self.ctl = self.link.ctl
        self.spec = worker_spec(
            settings, serial, pid, self.cpus, device, model_dir, self.link.bells,
            self.link.channel, models,
        )  # fmt: skip
        self.process: Any = None
        self.pidfd = -1  # the sentinel of a spawned worker (a forked one's is its own pidfd)

    def start(self, zygote: Zygote | None = None) -> None:
        """Fork from the zygote when one is given and answers, else spawn a fresh interpreter."""
        pid = zygote.fork(self.spec) if zygote is not None else None
        if pid is not None:
            self.process = ForkedProcess(pid)
            self.forked = True
            return
        from ringserve.workers.process.worker import main as worker_main

        self.process = SPAWN.Process(
            target=worker_main,
            args=(self.spec,),
            name=f"ringserve-worker-{self.serial}",
            daemon=False,
        )
        self.process.start()
        # multiprocessing's own sentinel is a pipe that reads EOF as the child's files close, a
        # moment before the kernel makes its exit status reapable: measured here, 13 of 20
        # SIGKILLed children still had no exit code when it fired. A pidfd is readable only
        # once the status can be collected.
        self.pidfd = os.pidfd_open(self.process.pid)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def sentinel(self) -> int:
        """Readable once the worker's exit status can be collected (a pidfd either way)."""
        return self.process.sentinel if self.forked else self.pidfd

    @property
    def draining(self) -> bool:
        return self.link.draining

    @property
    def dead(self) -> bool:
        return self.link.gone

    def drain(self) -> None:
        """Retire it: the engine gives it no new work (it stops once it holds none)."""
        self.link.drain()

    def mark_dead(self) -> None:
        """Its process is gone (or hung, and killed): the engine reads nothing more of it."""
        self.link.lose()

    def loaded(self) -> bool:
        return self.link.loaded()

    def state(self) -> str:
        if self.dead:
            return DEAD
        if not self.loaded():
            return STARTING
        if self.draining:
            return DRAINING
        if self.slot is None:
            return SPARE
        return DEGRADED if self.ctl.get("state") == L.W_DEGRADED else READY

    def serving(self) -> bool:
        """May take new requests."""
        return not self.dead and not self.draining and self.slot is not None and self.loaded()

    def pin(self, cpus: list[int]) -> None:
        """Move every thread of the worker onto `cpus` (a spare taking a slot)."""
        self.cpus = list(cpus)
        pid = self.pid
        if pid is None:
            return
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            tids = [pid]
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, self.cpus)

    def rss_bytes(self) -> int:
        return 0 if self.dead else pid_rss(self.pid)

    def signal(self, signum: int) -> None:
        pid = self.pid
        if pid is not None and self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def terminate(self, now: float) -> None:
        """Ask the worker to stop (it ignores SIGTERM: that may be a signal to the group)."""
        self.signal(STOP_SIGNAL)
        if self.kill_sent_at is None:
            self.kill_sent_at = now

    def reap(self) -> int | None:
        """Collect the exit status once the sentinel fired."""
        self.process.join(0)
        self.exitcode = self.process.exitcode
        return self.exitcode

    def release(self) -> None:
        """Close and unlink this worker's segments and doorbells (after it has exited)."""
        self.link.release()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        with contextlib.suppress(ValueError):
            self.process.close()


def status_row(slot: int | None, h: WorkerHandle, restarts: int) -> dict[str, Any]:
    """One worker as the control socket's status lists it (a spare's id is minus its serial)."""
    return {
        "id": slot if slot is not None else -h.serial,
        "pid": h.pid,
        "state": h.state(),
        "device": h.device if h.ctl.get("state") != L.W_DEGRADED else "cpu",
        "cpus": h.cpus,
        "lanes": h.spec.lanes,
        "rss_bytes": h.rss_bytes(),
        "inflight": len(h.link.assigned),
        "restarts": restarts,
        "heartbeat_age_ms": _age(h.ctl.heartbeat_age_ms()),
    }


def _age(ms: float | None) -> float | None:
    """A heartbeat age for status: None before the first beat."""
    return None if ms is None else round(ms, 1)
