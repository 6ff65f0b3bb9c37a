"""One worker process as the front-end sees it: its segments, doorbells and assigned requests."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from typing import Any

from shm import layout as L
from shm.control import ControlBlock
from shm.doorbell import EventFd, request_doorbell
from shm.ring import Ring
from shm.segment import Segment, segment_name
from workers.spec import WorkerSpec

SPAWN = multiprocessing.get_context("spawn")

# Front-end view of a worker (CONTRACT.md's states).
STARTING = "starting"
READY = "ready"
DEGRADED = "degraded"
DRAINING = "draining"
SPARE = "spare"
DEAD = "dead"


def request_ring_slots(settings: Any) -> int:
    """--ring-slots, raised to a power of two that holds the largest text a client may send
    twice over (a message that wraps needs its pad's room too), so every admitted text fits."""
    largest = max(settings.max_body, settings.max_frame) + L.RECORD_SIZE
    slots = max(1, settings.ring_slots)
    while slots * L.REQUEST_SLOT_SIZE < 2 * largest:
        slots *= 2
    return 1 << (slots - 1).bit_length()


class WorkerHandle:
    """Owns one worker process and the three segments it attaches to."""

    def __init__(
        self,
        serial: int,
        cpus: list[int],
        device: str,
        model_dir: str,
        generation: int,
        settings: Any,
    ) -> None:
        pid = os.getpid()
        self.serial = serial
        self.generation = generation
        self.slot: int | None = None  # serving slot id, None while spare
        self.draining = False
        self.dead = False
        self.exitcode: int | None = None
        self.cpus = list(cpus)
        self.device = device
        self.assigned: dict[int, Any] = {}  # msg id -> Request, in dispatch order
        self.started_at = time.monotonic()
        self.ready_at: float | None = None
        self.kill_sent_at: float | None = None
        slots = request_ring_slots(settings)
        answers = 1 << (2 * max(settings.ring_slots, settings.max_queue) - 1).bit_length()
        self.req_seg = Segment.create(
            segment_name(pid, serial, "req"), L.ring_bytes(L.REQUEST_SLOT_SIZE, slots)
        )
        self.rsp_seg = Segment.create(
            segment_name(pid, serial, "rsp"), L.ring_bytes(L.RESPONSE_SLOT_SIZE, answers)
        )
        self.ctl_seg = Segment.create(segment_name(pid, serial, "ctl"), L.CONTROL_BYTES)
        self.requests = Ring(self.req_seg, L.REQUEST_SLOT_SIZE, slots)
        self.responses = Ring(self.rsp_seg, L.RESPONSE_SLOT_SIZE, answers)
        self.ctl = ControlBlock(self.ctl_seg, create=True)
        self.doorbell = request_doorbell()
        self.eventfd = EventFd()
        self.spec = WorkerSpec(
            serial=serial,
            parent_pid=pid,
            cpus=self.cpus,
            threads=settings.threads,
            device=device,
            model_dir=model_dir,
            request_ring=self.req_seg.name,
            response_ring=self.rsp_seg.name,
            control=self.ctl_seg.name,
            buckets=tuple(settings.buckets),
            max_batch=settings.max_batch,
            max_delay_ms=settings.max_delay_ms,
            doorbell=self.doorbell,
            eventfd=self.eventfd,
            precision=getattr(settings, "precision", "fp32"),
            max_batch_tokens=settings.max_batch_tokens,
        )
        from workers.worker import main as worker_main

        self.process = SPAWN.Process(
            target=worker_main, args=(self.spec,), name=f"ringserve-worker-{serial}", daemon=False
        )

    def start(self) -> None:
        self.process.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    def loaded(self) -> bool:
        return self.ctl.get("state") in (L.W_READY, L.W_DEGRADED)

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
        pid = self.pid
        if pid is None or self.dead:
            return 0
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            return 0

    def submit(self, messages: list[tuple[int, bytes, int]]) -> int:
        """Write requests into the ring and ring the doorbell once per request written."""
        n = self.requests.write_many(messages)
        release = self.doorbell.release
        for _ in range(n):
            release()
        return n

    def signal(self, signum: int) -> None:
        pid = self.pid
        if pid is not None and self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)
        if self.kill_sent_at is None:
            self.kill_sent_at = time.monotonic()

    def reap(self) -> int | None:
        """Collect the exit status once the sentinel fired."""
        self.process.join(0)
        self.exitcode = self.process.exitcode
        return self.exitcode

    def release(self) -> None:
        """Close and unlink this worker's segments and doorbells (after it has exited)."""
        for ring in (self.requests, self.responses):
            ring.close()
        self.ctl.close()
        for seg in (self.req_seg, self.rsp_seg, self.ctl_seg):
            seg.close()
            seg.unlink()
        self.eventfd.close()
        with contextlib.suppress(ValueError):
            self.process.close()
