"""The supervisor: one loop in the front-end that keeps the worker pool at its target.

Scale, restart, reload, crash and hang recovery all work the same way: change the desired set
(slot count, a slot emptied, the model generation), then reconcile() toward it. Signal handlers
and control commands only record what they want; the loop does the work. Beside it: where a
worker runs (placement), when a slot may be filled again (policy), the zygote (forker), and
the checks on every worker (watch). Answers never pass here: the dispatcher reads them, and
tells the supervisor only that a worker is ready, or drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.logs import EventLog
from ringserve.service.pool.forker import Forker
from ringserve.service.pool.handle import WorkerHandle, status_row
from ringserve.service.pool.placement import Placement
from ringserve.service.pool.policy import SPARE_KEY, RestartPolicy
from ringserve.service.pool.watch import Watch, stop_all
from ringserve.service.settings import Config

log = logging.getLogger("ringserve.supervisor")

TICK_S = 0.05


class Supervisor:
    def __init__(
        self,
        settings: Config,
        dispatcher: Dispatcher,
        model_dir: str,
        device: str,
        events: EventLog | None = None,
        clock: Callable[[], float] = time.monotonic,
        make_handle: Callable[..., WorkerHandle] = WorkerHandle,
    ) -> None:
        self.clock = clock  # time is a parameter (STYLE.md 19): tests drive it by hand
        self.make_handle = make_handle
        self.settings = settings
        self.dispatcher = dispatcher
        self.model_dir = model_dir
        self.events = events  # structured event log (service.logs), optional
        self.placement = Placement(device, settings.threads)
        self.policy = RestartPolicy(clock, self._event)
        self.forker = Forker(settings, model_dir, self.placement.on_gpu(), clock, self._event)
        self.watch = Watch(settings, self._failed, self.restart, self._event)
        self.target = settings.serving_workers()
        if self.placement.gpus and settings.workers is None:  # on CUDA: sized by the GPUs
            self.target = len(self.placement.gpus) * max(1, settings.workers_per_gpu)
        self.target_spares = settings.spares
        self.generation = 0
        self.slots: dict[int, WorkerHandle | None] = {}
        self.restarts: dict[int, int] = {}  # slot -> times its process was replaced
        self.restarts_total = 0
        self.spares: list[WorkerHandle] = []  # starting or loaded, not serving
        self.retiring: list[WorkerHandle] = []  # draining or stopping
        self.all: dict[int, WorkerHandle] = {}  # serial -> handle, every live process
        self.serial = 0
        self.stopping = False
        self.draining = False  # the server drains: replace no worker, start no zygote
        self.fatal: str | None = None
        # Called just before a worker's segments are released (metrics keep its last counters).
        self.on_release: Callable[[WorkerHandle], None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wake = asyncio.Event()
        self.started = clock()

    # -- the desired set ------------------------------------------------------------------------
    def scale(self, n: int) -> None:
        self.target = max(0, n)
        self.wake.set()

    def restart(self, slot: int, reason: str = "restart") -> bool:
        """Replace the slot's worker (asked for, or recycled past the RSS limit)."""
        if self.slots.get(slot) is None:
            return False
        self._vacate(slot, reason)
        self._count_restart(slot)
        self.wake.set()
        return True

    def reload(self) -> None:
        """Bump the generation: reconcile then replaces every worker, one at a time."""
        self.generation += 1
        self.forker.reload(self.generation)
        self.policy.reload()
        for h in list(self.spares):  # spares carry the old model: replace them at once
            self.spares.remove(h)
            self._retire(h)
        self._event("reload", generation=self.generation)
        self.wake.set()

    def _count_restart(self, slot: int) -> None:
        self.restarts[slot] = self.restarts.get(slot, 0) + 1
        self.restarts_total += 1

    # -- processes ------------------------------------------------------------------------------
    def device_for(self, slot: int | None) -> str:
        """The slot's GPU (placement), or the CPU once its GPU failed (policy)."""
        if self.policy.on_cpu(slot):
            return "cpu"
        return self.placement.device_for(slot, [h.device for h in self.spares])

    def cpus_for(self, slot: int | None) -> list[int]:
        return self.placement.cpus_for(slot, self.device_for(slot) == "cpu")

    def spawn(self, slot: int | None) -> WorkerHandle:
        self.serial += 1
        cpus, device = self.cpus_for(slot), self.device_for(slot)
        handle = self.make_handle(
            self.serial, cpus, device, self.model_dir, self.generation, self.settings
        )
        handle.slot = slot
        handle.start(self.forker.ready(self.generation))
        handle.started_at = self.clock()
        self.all[handle.serial] = handle
        assert self.loop is not None
        self.loop.add_reader(handle.sentinel, self.on_exit, handle)
        self.dispatcher.add_worker(handle, self.loop, self)  # its answers are read there
        how = "fork" if handle.forked else "spawn"
        self._event("worker_started", worker=slot, serial=handle.serial, pid=handle.pid, how=how)
        return handle

    def worker_ready(self, handle: WorkerHandle) -> None:
        """The dispatcher heard the worker's first answer doorbell after it loaded."""
        if handle.ready_at is None:
            handle.ready_at = self.clock()
            boot_ms = handle.ctl.get("boot_ms")
            self._event("worker_ready", worker=handle.slot, pid=handle.pid, boot_ms=boot_ms)
            self.wake.set()

    def worker_drained(self, handle: WorkerHandle) -> None:
        """A draining worker answered the last it held: it may stop now."""
        handle.terminate(self.clock())

    def on_exit(self, handle: WorkerHandle) -> None:
        """The process sentinel fired: the worker is gone (any signal, any exit)."""
        if self.watch.exit_pending(handle):
            return  # the sentinel stays readable: the loop calls this again on its next pass
        if handle.dead:  # already mourned (hung, then killed): only release it
            self._finish(handle)
            return
        code = handle.exitcode
        self._failed(handle, f"exited with code {code}", code)

    def _failed(self, handle: WorkerHandle, reason: str, code: int | None = None) -> None:
        """The worker is gone or hung: take it out, move what it held, refill its place."""
        if handle.dead:
            return
        loaded = handle.ready_at is not None or handle.loaded()
        handle.dead = True
        key = self._take_out(handle)
        if self.policy.died(handle, key, code, loaded) and not self.stopping:
            self.fatal = f"a worker could not load the model from {self.model_dir}; see its error"
        self._update_serving()  # before rerouting, so nothing goes back to the dead worker
        if not self.fatal:
            self.reconcile()  # a warm spare takes the slot now, not at the next tick
        moved = self.dispatcher.reroute(handle)
        level = logging.INFO if handle.draining else logging.WARNING
        self._event("worker_died", level=level, worker=handle.slot, pid=handle.pid,
                    reason=reason, exit_code=code, rerouted=moved)  # fmt: skip
        self._finish(handle)
        self.wake.set()

    def _take_out(self, handle: WorkerHandle) -> int | None:
        """Remove a gone worker from the set; the key its death counts under in the crash
        backoff (its slot, SPARE_KEY for a spare), or None when it says nothing of one."""
        if handle in self.spares:
            self.spares.remove(handle)
        if handle in self.retiring:
            self.retiring.remove(handle)
        slot = handle.slot
        if slot is not None and self.slots.get(slot) is handle:
            self.slots[slot] = None
            self._count_restart(slot)
            return slot
        if slot is None and not handle.draining and not self.stopping:
            return SPARE_KEY  # a crash-looping spare backs off like a slot
        return None

    def _finish(self, handle: WorkerHandle) -> None:
        self.dispatcher.remove_worker(handle)
        if handle.process.exitcode is None:  # declared dead while still running (hung)
            handle.signal(signal.SIGKILL)  # on_exit releases it once the kernel has freed it
            return
        assert self.loop is not None
        self.loop.remove_reader(handle.sentinel)
        self._release(handle)

    def _release(self, handle: WorkerHandle) -> None:
        if self.on_release is not None:
            self.on_release(handle)  # metrics keep its final counters
        self.all.pop(handle.serial, None)
        handle.release()

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
        for slot in [s for s in self.slots if s >= self.target]:  # scale down
            self._vacate(slot, "scale")
            del self.slots[slot]
        for slot in range(self.target):
            self._fill(slot)
        self._keep_spares()
        self._update_serving()

    def _fill(self, slot: int) -> None:
        handle = self.slots.get(slot)
        if handle is not None and handle.generation != self.generation:
            if self._ready_spare() is None:  # rolling reload, one slot at a time
                return
            self._vacate(slot, "reload")
            handle = None
        if handle is not None or self.policy.held(slot):
            return
        spare = self._ready_spare(self.device_for(slot))
        if spare is not None:
            self._promote(spare, slot)
        elif not self.draining:
            self.slots[slot] = self.spawn(slot)

    def _keep_spares(self) -> None:
        want = self.target_spares
        if any(h is not None and h.generation != self.generation for h in self.slots.values()):
            want = max(1, want)  # a reload needs somewhere to roll to
        booting = any(h is not None and not h.loaded() for h in self.slots.values())
        if booting or self.forker.booting():  # serving workers boot first; spares wait for
            want = min(want, len(self.spares))  # a booting zygote (fast forks)
        if self.draining:
            want = 0
        while len(self.spares) < want and not self.policy.held(SPARE_KEY):
            self.spares.append(self.spawn(None))

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

    # -- the loop -------------------------------------------------------------------------------
    def check(self) -> None:
        """One pass of watching: the zygote, then every worker (watch.Watch)."""
        if not self.stopping and not self.draining:
            self.forker.tend(self.generation)
        self.watch.check(self.all.values(), self.clock())

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        if not self.stopping and not self.draining:
            self.forker.tend(self.generation)
        await self.forker.wait(lambda: self.stopping)
        self.reconcile()
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), TICK_S)
            self.wake.clear()
            self.check()
            if self.fatal:
                return
            self.reconcile()

    async def stop(self, timeout: float = 5.0) -> None:
        """TERM every worker, KILL what is left (watch.stop_all), release every segment."""
        self.stopping = True
        self.forker.close()
        handles = list(self.all.values())
        assert self.loop is not None
        for h in handles:  # from here on this method alone reaps and releases
            self.dispatcher.remove_worker(h)
            self.loop.remove_reader(h.sentinel)
        await stop_all(handles, self.clock(), timeout)
        for h in handles:
            h.dead = True
            self._release(h)

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
        return [status_row(s, h, self.restarts.get(s, 0) if s is not None else 0)
                for s, h in self.handles()]  # fmt: skip

    def _event(self, event: str, level: int = logging.INFO, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, level=level, **fields)
        else:
            log.log(level, "%s %s", event, fields)
