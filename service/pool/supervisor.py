"""The supervisor: one loop in the front-end that keeps the worker pool at its target.

Scale, restart, reload, crash and hang recovery all work the same way: change the desired set
(slot count, a slot emptied, the model generation), then reconcile() toward it. Signal handlers
and control commands only record what they want; tick() does the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.logs import EventLog
from ringserve.service.pool.handle import WorkerHandle
from ringserve.service.settings import Config
from ringserve.shm import layout as L
from ringserve.workers import nvml
from ringserve.workers.spec import EXIT_BOOT_ERROR, EXIT_DEVICE_ERROR, FAKE_GPU
from ringserve.workers.zygote import Zygote

log = logging.getLogger("ringserve.supervisor")

TICK_S = 0.05
RSS_EVERY_S = 0.5  # /proc reads for the RSS limit: a leak is slow, the heartbeat tick is not
KILL_AFTER_S = 3.0  # TERM, then KILL when a stopping worker has not left by then
BOOT_TIMEOUT_S = 180.0  # a worker that has not loaded by then is killed and replaced
CRASH_WINDOW_S = 30.0
CRASH_LIMIT = 5  # crashes of one slot within the window before restarts back off
STABLE_S = 2.0  # a worker ready this long that dies is not crash-looping (no backoff)
SPARE_KEY = -1  # crash history and backoff of the spares, beside the slots' own
ZYGOTE_RETRY_S = 5.0  # a dead zygote is replaced at most this often; workers spawn meanwhile
ZYGOTE_RETRY_MAX_S = 300.0  # ... doubling for each zygote in a row that died before it was ready
ZYGOTE_WAIT_S = 120.0  # at start, workers wait this long for the zygote before spawning
EXIT_STATUS_WAIT_S = 1.0  # longest wait for a gone worker's exit status (see _status_pending)
DEVICE_RETRIES = 3  # boots of a slot that fail on its GPU before the slot serves from the CPU


def gpu_indices(device: str) -> list[int]:
    """The CUDA device indices a resolved --device names ([0] for the test-only fake GPU)."""
    if device == FAKE_GPU:
        return [0]
    if device == "cuda":
        return list(range(nvml.cuda_device_count()))
    if device.startswith("cuda:"):
        return [int(device.split(":", 1)[1])]
    return []


class Supervisor:
    def __init__(
        self,
        settings: Config,
        dispatcher: Dispatcher,
        model_dir: str,
        device: str,
        events: EventLog | None = None,
        clock: Callable[[], float] = time.monotonic,
        make_handle: Callable[..., Any] = WorkerHandle,
    ) -> None:
        self.clock = clock  # time is a parameter (STYLE.md 19): tests drive it by hand
        self.make_handle = make_handle
        self.settings = settings
        self.dispatcher = dispatcher
        self.model_dir = model_dir
        self.device = device
        self.events = events  # structured event log (service.logs), optional
        self.target = settings.serving_workers()
        self.target_spares = settings.spares
        self.slots: dict[int, WorkerHandle | None] = {}
        self.restarts: dict[int, int] = {}
        self.crashes: dict[int, list[float]] = {}
        self.backoff_until: dict[int, float] = {}
        self.device_errors: dict[int | None, int] = {}  # slot (None: spares) -> boots failed
        self.spares: list[WorkerHandle] = []  # starting or loaded, not serving
        self.retiring: list[WorkerHandle] = []  # draining or stopping
        self.all: dict[int, WorkerHandle] = {}  # serial -> handle, every live process
        self.serial = 0
        self.generation = 0
        self.stopping = False
        self.draining = False  # the server drains: replace no worker, start no zygote
        self.fatal: str | None = None
        # Called just before a worker's segments are released (metrics keep its last counters).
        self.on_release: Callable[[WorkerHandle], None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wake = asyncio.Event()
        self.started = clock()
        self.restarts_total = 0
        self.exit_seen: dict[int, float] = {}  # serial -> when its sentinel first fired
        self.use_zygote = settings.start_method == "zygote"
        self.zygote: Zygote | None = None
        self.zygote_retry_at = 0.0
        self.zygote_failures = 0  # zygotes in a row that died before they were ready
        self.rss_checked_at = 0.0
        self.ncpu = sorted(os.sched_getaffinity(0))
        self.gpus = gpu_indices(device)  # CUDA devices the workers spread over; [] on the CPU
        self.gpu_cpus = {k: nvml.default().local_cpus(k) for k in self.gpus} if self.gpus else {}
        if self.gpus and settings.workers is None:  # on CUDA the pool is sized by the GPUs
            self.target = len(self.gpus) * max(1, settings.workers_per_gpu)

    # -- the desired set ------------------------------------------------------------------------
    def scale(self, n: int) -> None:
        self.target = max(0, n)
        self.wake.set()

    def restart(self, slot: int) -> bool:
        handle = self.slots.get(slot)
        if handle is None:
            return False
        self._vacate(slot, "restart")
        self.restarts[slot] = self.restarts.get(slot, 0) + 1
        self.restarts_total += 1
        self.wake.set()
        return True

    def reload(self) -> None:
        """Bump the generation: reconcile then replaces every worker, one at a time."""
        self.generation += 1
        if self.zygote is not None:  # a new zygote loads the new artifact
            self._replace_zygote("reload")
        self.device_errors.clear()  # a reload tries every slot's GPU again
        for h in list(self.spares):  # spares carry the old model: replace them at once
            self.spares.remove(h)
            self._retire(h)
        self._event("reload", generation=self.generation)
        self.wake.set()

    # -- processes ------------------------------------------------------------------------------
    def device_for(self, slot: int | None) -> str:
        """Slot s runs on GPU s mod G; the CPU device is as given. A slot whose GPU failed its
        boot DEVICE_RETRIES times serves from the CPU until the next reload."""
        if self.device_errors.get(slot, 0) >= DEVICE_RETRIES:
            return "cpu"
        if not self.gpus or self.device == FAKE_GPU:
            return self.device
        if slot is None:  # a new spare goes to the GPU with the fewest spares
            have = [h.device for h in self.spares]
            return min((f"cuda:{g}" for g in self.gpus), key=have.count)
        return f"cuda:{self.gpus[slot % len(self.gpus)]}"

    def _near_cpus(self, slot: int) -> list[int]:
        """The CPUs nearest the slot's GPU (NVML or sysfs), or [] when the system does not say."""
        if not self.gpus:
            return []
        near = self.gpu_cpus.get(self.gpus[slot % len(self.gpus)], [])
        return [c for c in near if c in self.ncpu]

    def cpus_for(self, slot: int | None) -> list[int]:
        if slot is None:
            return list(self.ncpu)
        if self.gpus and self.device_for(slot) != "cpu":
            # A GPU worker tokenizes, moves rings and launches kernels: it gets every CPU near
            # its GPU (shared with that GPU's other workers), not one core.
            return self._near_cpus(slot) or list(self.ncpu)
        per = max(1, self.settings.threads)
        near = self._near_cpus(slot)
        if near:  # disjoint sets within the GPU's CPUs, in slot order
            rank = sum(1 for s in range(slot) if self._near_cpus(s) == near)
            return [near[(rank * per + i) % len(near)] for i in range(per)]
        start = (slot * per) % len(self.ncpu)
        return [self.ncpu[(start + i) % len(self.ncpu)] for i in range(per)]

    # -- the zygote -----------------------------------------------------------------------------
    def _start_zygote(self) -> None:
        self.zygote = Zygote(self.model_dir, self.generation, self._workers_run_torch())
        self.zygote.started_at = self.clock()
        self.zygote_retry_at = self.clock() + ZYGOTE_RETRY_S
        self._event("zygote_started", pid=self.zygote.process.pid, generation=self.generation)

    def _workers_run_torch(self) -> bool:
        """Whether workers run TorchScript (the zygote then holds the CPU weights to share)."""
        from ringserve.workers.artifact import ArtifactError, load_manifest
        from ringserve.workers.onnx_model import choose_runtime

        s = self.settings
        try:
            manifest = load_manifest(self.model_dir, verify=False)
            on_gpu = bool(self.gpus) or self.device == FAKE_GPU
            runtime, _ = choose_runtime(s.runtime, s.precision, on_gpu, manifest)
        except (ArtifactError, ValueError):
            return True  # the workers will report the problem themselves
        return runtime == "torch"

    def _replace_zygote(self, reason: str) -> None:
        old, self.zygote = self.zygote, None
        if old is not None and not old.announced and reason != "reload":
            # It never became ready: back off, rather than re-import torch every few seconds.
            self.zygote_failures += 1
            delay = min(ZYGOTE_RETRY_MAX_S, ZYGOTE_RETRY_S * 2 ** (self.zygote_failures - 1))
            self.zygote_retry_at = max(self.zygote_retry_at, old.started_at + delay)
        if old is not None:
            level = logging.INFO if reason == "reload" else logging.WARNING
            self._event("zygote_replaced", level=level, pid=old.process.pid, reason=reason)
            old.close()
        if self.clock() >= self.zygote_retry_at or reason == "reload":
            self._start_zygote()

    def tend_zygote(self) -> None:
        """Keep one live zygote for the current generation (when the start method wants one)."""
        if not self.use_zygote or self.stopping or self.draining:
            return
        z = self.zygote
        if z is None:
            if self.clock() >= self.zygote_retry_at:
                self._start_zygote()
        elif not z.alive():
            self._replace_zygote("died")
        elif z.poll() and not z.announced:
            z.announced = True
            self.zygote_failures = 0
            boot_ms = round((self.clock() - z.started_at) * 1000)
            self._event("zygote_ready", pid=z.process.pid, boot_ms=boot_ms)

    def _forker(self) -> Zygote | None:
        z = self.zygote
        if z is not None and z.generation == self.generation and z.poll():
            return z
        return None

    def zygote_booting(self) -> bool:
        z = self.zygote
        return z is not None and z.alive() and not z.poll()

    async def wait_for_zygote(self) -> None:
        """At start only: forking N workers from a ready zygote beats N cold spawns."""
        deadline = self.clock() + ZYGOTE_WAIT_S
        while self.zygote_booting() and self.clock() < deadline and not self.stopping:
            await asyncio.sleep(0.02)
        if self.zygote is not None and not self.zygote.poll():
            self._event("zygote_unavailable", level=logging.WARNING, action="spawning workers")

    def spawn(self, slot: int | None) -> WorkerHandle:
        self.serial += 1
        handle = self.make_handle(
            self.serial,
            self.cpus_for(slot),
            self.device_for(slot),
            self.model_dir,
            self.generation,
            self.settings,
        )
        handle.slot = slot
        handle.start(self._forker())
        handle.started_at = self.clock()
        self.all[handle.serial] = handle
        assert self.loop is not None
        self.loop.add_reader(handle.sentinel, self.on_exit, handle)
        self.loop.add_reader(handle.eventfd.fd, self.on_doorbell, handle)
        how = "fork" if handle.forked else "spawn"
        self._event("worker_started", worker=slot, serial=handle.serial, pid=handle.pid, how=how)
        return handle

    def on_doorbell(self, handle: WorkerHandle) -> None:
        if handle.dead:
            return
        if handle.ready_at is None and handle.loaded():  # first ring after boot: it is ready
            handle.ready_at = self.clock()
            self._event(
                "worker_ready",
                worker=handle.slot,
                pid=handle.pid,
                boot_ms=handle.ctl.get("boot_ms"),
            )
            self.wake.set()
        self.dispatcher.on_answers(handle)
        if handle.draining and not handle.assigned:
            handle.terminate(self.clock())

    def on_exit(self, handle: WorkerHandle) -> None:
        """The process sentinel fired: the worker is gone (any signal, any exit)."""
        code = handle.reap()
        if code is None and self._status_pending(handle):
            return  # the sentinel stays readable: the loop calls this again on its next pass
        self.exit_seen.pop(handle.serial, None)
        if handle.dead:  # already mourned (hung, then killed): only release it
            self._finish(handle)
            return
        self._declare_dead(handle, f"exited with code {code}", code)

    def _status_pending(self, handle: WorkerHandle) -> bool:
        """Whether a gone worker's exit status may still come: a forked one killed before it
        was re-parented here is the middle process's child for a moment, so waitpid finds
        nothing yet. Waited for up to EXIT_STATUS_WAIT_S (wall time: the kernel's, not the
        supervisor's clock), so a SIGKILL is reported as -9 rather than as no code at all."""
        now = time.monotonic()
        first = self.exit_seen.setdefault(handle.serial, now)
        return now - first < EXIT_STATUS_WAIT_S

    def _declare_dead(self, handle: WorkerHandle, reason: str, code: int | None) -> None:
        if handle.dead:
            return
        was_loaded = handle.ready_at is not None or handle.loaded()
        try:
            self.dispatcher.on_answers(handle)  # answers it published before dying still count
        except Exception:
            log.exception("reading the answers of a dead worker")
        handle.dead = True
        slot = handle.slot
        if handle in self.spares:
            self.spares.remove(handle)
        if handle in self.retiring:
            self.retiring.remove(handle)
        if slot is not None and self.slots.get(slot) is handle:
            self.slots[slot] = None
            self.restarts[slot] = self.restarts.get(slot, 0) + 1
            self.restarts_total += 1
            if self._crash_looping(handle):
                self._note_crash(slot)
        if (
            slot is None
            and not handle.draining
            and not self.stopping
            and self._crash_looping(handle)
        ):
            self._note_crash(SPARE_KEY)  # a crash-looping spare backs off like a slot
        if code == EXIT_BOOT_ERROR and not was_loaded and not self.stopping:
            self.fatal = f"a worker could not load the model from {self.model_dir}; see its error"
        if code == EXIT_DEVICE_ERROR and not was_loaded:  # never a server stop
            self._device_error(slot, handle.device)
        self._update_serving()  # before rerouting, so nothing goes back to the dead worker
        if not self.fatal:
            self.reconcile()  # a warm spare takes the slot now, not at the next tick
        moved = self.dispatcher.reroute(handle)
        level = logging.INFO if handle.draining else logging.WARNING
        self._event(
            "worker_died",
            level=level,
            worker=slot,
            pid=handle.pid,
            reason=reason,
            exit_code=code,
            rerouted=moved,
        )
        self._finish(handle)
        self.wake.set()

    def _finish(self, handle: WorkerHandle) -> None:
        assert self.loop is not None
        self.loop.remove_reader(handle.eventfd.fd)
        if handle.process.exitcode is None:  # declared dead while still running (hung)
            handle.signal(signal.SIGKILL)  # on_exit releases it once the kernel has freed it
            return
        self.loop.remove_reader(handle.sentinel)
        if self.on_release is not None:
            self.on_release(handle)  # metrics keep its final counters
        self.all.pop(handle.serial, None)
        self.dispatcher.forget(handle)
        handle.release()

    def _crash_looping(self, handle: WorkerHandle) -> bool:
        """A death counts toward the crash backoff only if the worker died while booting or
        within STABLE_S of being ready: that is a loop to slow down. One that had served longer
        was killed or ran out of memory, and is replaced at once however often that happens
        (forked replacements make back-to-back kills common, and each is ready in ~0.3 s)."""
        return handle.ready_at is None or self.clock() - handle.ready_at < STABLE_S

    def _note_crash(self, slot: int) -> None:
        now = self.clock()
        recent = [t for t in self.crashes.get(slot, []) if now - t < CRASH_WINDOW_S] + [now]
        self.crashes[slot] = recent
        if len(recent) >= CRASH_LIMIT:
            delay = min(30.0, 0.5 * 2 ** (len(recent) - CRASH_LIMIT))
            self.backoff_until[slot] = now + delay
            self._event("worker_backoff", level=logging.WARNING, worker=slot, delay_s=delay)

    def _device_error(self, slot: int | None, device: str) -> None:
        """A boot failed on its GPU: retry after a growing delay, then give the slot the CPU."""
        n = self.device_errors.get(slot, 0) + 1
        self.device_errors[slot] = n
        if slot is not None and n < DEVICE_RETRIES:
            self.backoff_until[slot] = self.clock() + 0.25 * 2 ** (n - 1)
        fallback = "cpu" if n >= DEVICE_RETRIES else device
        self._event("worker_device_error", level=logging.WARNING, worker=slot, device=device,
                    failures=n, next_device=fallback)  # fmt: skip

    def _vacate(self, slot: int, reason: str) -> None:
        handle = self.slots.get(slot)
        if handle is not None:
            self.slots[slot] = None
            self._retire(handle)
            self._event("worker_retire", worker=slot, pid=handle.pid, reason=reason)
        self._update_serving()

    def _retire(self, handle: WorkerHandle) -> None:
        """Stop sending it work; it is stopped once what it holds is answered."""
        handle.draining = True
        if handle not in self.retiring:
            self.retiring.append(handle)
        if not handle.assigned:
            handle.terminate(self.clock())

    def _update_serving(self) -> None:
        self.dispatcher.serving = [h for h in self.slots.values() if h is not None and h.serving()]
        if self.dispatcher.serving:
            self.dispatcher.flush_waiting()

    # -- reconcile ------------------------------------------------------------------------------
    def reconcile(self) -> None:
        if self.stopping:
            return
        now = self.clock()
        for slot in [s for s in self.slots if s >= self.target]:  # scale down
            self._vacate(slot, "scale")
            del self.slots[slot]
        for slot in range(self.target):
            handle = self.slots.get(slot)
            if handle is not None and handle.generation != self.generation:
                if self._ready_spare() is not None:  # rolling reload, one slot at a time
                    self._vacate(slot, "reload")
                    handle = None
                else:
                    continue
            if handle is not None or now < self.backoff_until.get(slot, 0.0):
                continue
            spare = self._ready_spare(self.device_for(slot))
            if spare is not None:
                self._promote(spare, slot)
            elif not self.draining:
                self.slots[slot] = self.spawn(slot)
        want_spares = self.target_spares
        if any(h is not None and h.generation != self.generation for h in self.slots.values()):
            want_spares = max(1, want_spares)  # a reload needs somewhere to roll to
        booting = any(h is not None and not h.loaded() for h in self.slots.values())
        if booting or self.zygote_booting():  # serving workers boot first; spares wait for
            want_spares = min(want_spares, len(self.spares))  # a booting zygote (fast forks)
        if self.draining:
            want_spares = 0
        while len(self.spares) < want_spares and now >= self.backoff_until.get(SPARE_KEY, 0.0):
            self.spares.append(self.spawn(None))
        self._update_serving()

    def _ready_spare(self, device: str | None = None) -> WorkerHandle | None:
        """A loaded spare of this generation (on `device` when given: spares are per GPU)."""
        for h in self.spares:
            fresh = h.loaded() and h.generation == self.generation and not h.dead
            if fresh and (device is None or h.device == device):
                return h
        return None

    def _promote(self, spare: WorkerHandle, slot: int) -> None:
        self.spares.remove(spare)
        spare.slot = slot
        spare.pin(self.cpus_for(slot))
        self.slots[slot] = spare
        self._event("worker_promoted", worker=slot, pid=spare.pid)

    # -- watching -------------------------------------------------------------------------------
    def check(self) -> None:
        now = self.clock()
        self.tend_zygote()
        limit_ms = self.settings.heartbeat_timeout_s * 1000
        rss_due = now - self.rss_checked_at >= RSS_EVERY_S
        if rss_due:
            self.rss_checked_at = now
        for handle in list(self.all.values()):
            if handle.dead:
                if handle.kill_sent_at and now - handle.kill_sent_at > KILL_AFTER_S:
                    handle.signal(signal.SIGKILL)
                continue
            if handle.loaded():
                if handle.ready_at is None:  # loaded but its first doorbell not seen yet
                    handle.ready_at = now
                age = handle.ctl.heartbeat_age_ms()
                if age is not None and age > limit_ms:
                    self._event(
                        "worker_hung",
                        level=logging.WARNING,
                        worker=handle.slot,
                        pid=handle.pid,
                        heartbeat_age_ms=round(age),
                    )
                    self._declare_dead(handle, "heartbeat stale", None)
                    continue
            elif now - handle.started_at > BOOT_TIMEOUT_S:
                self._declare_dead(handle, "boot timeout", None)
                continue
            if handle.kill_sent_at and now - handle.kill_sent_at > KILL_AFTER_S:
                handle.signal(signal.SIGKILL)
            limit = self.settings.worker_max_rss
            if limit and rss_due and not handle.draining and handle.slot is not None:
                rss = handle.rss_bytes()
                if rss > limit:
                    self._event(
                        "worker_recycle",
                        level=logging.WARNING,
                        worker=handle.slot,
                        pid=handle.pid,
                        rss_bytes=rss,
                        limit=limit,
                    )
                    slot = handle.slot
                    self._vacate(slot, "rss limit")
                    self.restarts[slot] = self.restarts.get(slot, 0) + 1
                    self.restarts_total += 1

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.tend_zygote()
        await self.wait_for_zygote()
        self.reconcile()
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), TICK_S)
            self.wake.clear()
            self.check()
            self.dispatcher.expire(self.dispatcher.clock())  # deadlines are on its clock
            if self.fatal:
                return
            self.reconcile()

    # -- shutdown -------------------------------------------------------------------------------
    async def stop(self, timeout: float = 5.0) -> None:
        """TERM every worker, KILL what is left after KILL_AFTER_S, release every segment."""
        self.stopping = True
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        handles = list(self.all.values())
        assert self.loop is not None
        for h in handles:  # from here on this method alone reaps and releases
            self.loop.remove_reader(h.eventfd.fd)
            self.loop.remove_reader(h.sentinel)
            h.draining = True
            h.terminate(self.clock())
        deadline = time.monotonic() + timeout
        while any(h.process.exitcode is None for h in handles if h.pid is not None):
            now = time.monotonic()
            for h in handles:
                if h.kill_sent_at and now - h.kill_sent_at > min(KILL_AFTER_S, timeout):
                    h.signal(signal.SIGKILL)
            if now > deadline:
                for h in handles:
                    h.signal(signal.SIGKILL)
            await asyncio.sleep(0.02)
            for h in handles:
                if h.pid is not None:
                    h.process.join(0)
        for h in handles:
            h.dead = True
            if self.on_release is not None:
                self.on_release(h)
            self.all.pop(h.serial, None)
            h.release()

    # -- views ----------------------------------------------------------------------------------
    def handles(self) -> list[tuple[int | None, WorkerHandle]]:
        out: list[tuple[int | None, WorkerHandle]] = [
            (s, h) for s, h in sorted(self.slots.items()) if h is not None
        ]
        out += [(None, h) for h in self.spares]
        out += [(h.slot, h) for h in self.retiring if not h.dead]
        return out

    def ready_count(self) -> int:
        return sum(1 for h in self.slots.values() if h is not None and h.serving())

    def status_rows(self) -> list[dict[str, Any]]:
        rows = []
        for slot, h in self.handles():
            rows.append(
                {
                    "id": slot if slot is not None else -h.serial,
                    "pid": h.pid,
                    "state": h.state(),
                    "device": h.device if h.ctl.get("state") != L.W_DEGRADED else "cpu",
                    "cpus": h.cpus,
                    "rss_bytes": h.rss_bytes(),
                    "inflight": len(h.assigned),
                    "restarts": self.restarts.get(slot, 0) if slot is not None else 0,
                    "heartbeat_age_ms": _age(h.ctl.heartbeat_age_ms()),
                }
            )
        return rows

    def _event(self, event: str, level: int = logging.INFO, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, level=level, **fields)
        else:
            log.log(level, "%s %s", event, fields)


def _age(ms: float | None) -> float | None:
    """A heartbeat age for status: None before the first beat."""
    return None if ms is None else round(ms, 1)
