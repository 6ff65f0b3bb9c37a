"""The supervisor: one loop in the front-end that keeps the worker pool at its target.

Scale, restart, reload, crash and hang recovery all work the same way: change the desired set
(slot count, a slot emptied, the model generation), then reconcile() toward it. Signal handlers
and control commands only record what they want; the loop does the work. Beside it: where a
worker runs (placement), when a slot may be filled again (policy), the zygote (forker), the
checks on every worker (watch), the model list and its generations (generations), a roll's
warm-ups (warmup). Answers never pass here: the dispatcher reads them, and tells the
supervisor only that a worker is ready, drained, or faulty (it wrote a malformed answer: it is
declared dead like any other). A spawn that /dev/shm has no room for is refused, said, and
tried again later (policy.refused); the pool serves on with the workers it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ringserve.service.config.settings import Config
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.logs import EventLog
from ringserve.service.pool.forker import Forker
from ringserve.service.pool.generations import Generations
from ringserve.service.pool.handle import WorkerHandle
from ringserve.service.pool.placement import Placement
from ringserve.service.pool.policy import SPARE_KEY, RestartPolicy
from ringserve.service.pool.processes import Processes
from ringserve.service.pool.roll import Rolls
from ringserve.service.pool.roster import Roster
from ringserve.service.pool.warmup import Warmups
from ringserve.service.pool.watch import Watch
from ringserve.shm.segment import SegmentError
from ringserve.workers.spec import ModelRef

log = logging.getLogger("ringserve.supervisor")

TICK_S = 0.05


class Supervisor:
    def __init__(
        self,
        settings: Config,
        dispatcher: Dispatcher,
        models: str | Sequence[ModelRef],
        device: str,
        events: EventLog | None = None,
        clock: Callable[[], float] = time.monotonic,
        make_handle: Callable[..., WorkerHandle] = WorkerHandle,
    ) -> None:
        self.clock = clock  # time is a parameter (STYLE.md 19): tests drive it by hand
        self.dispatcher = dispatcher
        # Every model a worker serves (a bare directory: the one model there, as before).
        refs: tuple[ModelRef, ...] = () if isinstance(models, str) else tuple(models)
        model_dir = models if isinstance(models, str) else refs[0].model_dir
        self.events = events  # structured event log (service.logs), optional
        # A worker's share of cores: its threads for each of its lanes (settings.resolve_lanes).
        self.placement = Placement(device, settings.threads * settings.lane_count())
        self.policy = RestartPolicy(clock, self._event)
        self.forker = Forker(settings, refs, model_dir, self.placement.on_gpu(), clock, self._event)
        self.watch = Watch(settings, self._failed, self.restart, self._event)
        self.target = settings.serving_workers()
        if self.placement.gpus and settings.workers is None:  # on CUDA: sized by the GPUs
            self.target = len(self.placement.gpus) * max(1, settings.workers_per_gpu)
        self.target_spares = settings.spares
        self.rolls = Rolls(self, clock)  # the rolls onto a new model list (set_models)
        self.roster = Roster(dispatcher, clock, self._event, self.rolls.admits)  # who is where
        # A tentative roll's new workers answer a warm-up before they serve (warmup.py).
        self.warmups = Warmups(dispatcher, clock, self.rolls, self.roster, self._failed)
        self.procs = Processes(settings, refs, model_dir, dispatcher, make_handle,
                               self.on_exit, clock, self.worker_ready, self._failed)  # fmt: skip
        # The same containers, under the names the control status and metrics read.
        self.slots, self.spares = self.roster.slots, self.roster.spares
        self.retiring, self.restarts = self.roster.retiring, self.roster.restarts
        self.all = self.procs.all
        self.stopping = False
        self.draining = False  # the server drains: replace no worker, start no zygote
        self.fatal: str | None = None
        self.wake = asyncio.Event()
        self.lists = Generations(refs, model_dir, self.forker, self.procs, self.roster,
                                 self.policy, self.rolls, self._event, self.wake)  # fmt: skip

    # -- the desired set ------------------------------------------------------------------------
    def scale(self, n: int) -> None:
        self.target = max(0, n)
        self.wake.set()

    def restart(self, slot: int, reason: str = "restart") -> bool:
        """Replace the slot's worker (asked for, or recycled past the RSS limit)."""
        if self.slots.get(slot) is None:
            return False
        self.roster.vacate(slot, reason)
        self.roster.count_restart(slot)
        self.wake.set()
        return True

    def reload(self) -> None:
        self.lists.reload()

    def set_models(self, models: Sequence[ModelRef], tentative: bool = False) -> int:
        return self.lists.set_models(models, tentative)  # generations.py

    def roll_back(self, models: Sequence[ModelRef], failed: int) -> int:
        return self.lists.roll_back(models, failed)

    @property
    def generation(self) -> int:
        return self.lists.generation

    # -- processes ------------------------------------------------------------------------------
    def device_for(self, slot: int | None) -> str:
        """The slot's GPU (placement), or the CPU once its GPU failed (policy)."""
        spares = [h.device for h in self.roster.spares]
        return "cpu" if self.policy.on_cpu(slot) else self.placement.device_for(slot, spares)

    def cpus_for(self, slot: int | None) -> list[int]:
        return self.placement.cpus_for(slot, self.device_for(slot) == "cpu")

    def spawn(self, slot: int | None) -> WorkerHandle | None:
        """A new worker for `slot` (None: a spare); None when /dev/shm has no room for its
        segments (policy.refused says so, and holds the slot back; the others serve on)."""
        if self.generation in self.rolls.failed:  # its caller rolls back: start none of it
            return None
        cpus, device = self.cpus_for(slot), self.device_for(slot)
        zygote = self.forker.ready(self.generation)
        key = SPARE_KEY if slot is None else slot
        try:
            handle = self.procs.start(slot, cpus, device, self.generation, zygote)
        except SegmentError as exc:
            self.policy.refused(key, str(exc), self.roster.ready_count())
            return None
        self.policy.spawned(key)
        how = "fork" if handle.forked else "spawn"
        self._event("worker_started", worker=slot, serial=handle.serial, pid=handle.pid, how=how)
        return handle

    def worker_ready(self, handle: WorkerHandle) -> None:
        """Its first answer doorbell; a tentative roll's is sent its warm-up (warmup.py)."""
        boot_ms = handle.ctl.get("boot_ms")
        self._event("worker_ready", worker=handle.slot, pid=handle.pid, boot_ms=boot_ms)
        if not self.rolls.admits(handle):
            self.warmups.send(handle)
        self.wake.set()

    def on_exit(self, handle: WorkerHandle) -> None:
        """The process sentinel fired: the worker is gone (any signal, any exit)."""
        if self.watch.exit_pending(handle):
            return  # the sentinel stays readable: the loop calls this again on its next pass
        if handle.dead:  # already mourned (hung, then killed): only release it
            self.procs.finish(handle)
            return
        code = handle.exitcode
        self._failed(handle, f"exited with code {code}", code)

    def _failed(self, handle: WorkerHandle, reason: str, code: int | None = None) -> None:
        """The worker is gone or hung: take it out, move what it held, refill its place."""
        if handle.dead:
            return
        loaded = handle.ready_at is not None or handle.loaded()
        handle.mark_dead()
        self.warmups.forget(handle)
        key = self.roster.take_out(handle, self.stopping)
        boot_error = self.policy.died(handle, key, code, loaded) and not self.stopping
        # A model that cannot load stops the server outside a tentative roll only (roll.py).
        if boot_error and self.rolls.stops_server(handle.generation, self.generation, code):
            self.fatal = f"a worker could not load the model from {self.lists.model_dir}"
        elif not self.stopping and not self.rolls.admits(handle):  # gone before it served
            self.rolls.fail(handle.generation, f"a worker of the new models {reason}")
        self.roster.update_serving()  # before rerouting, so nothing goes back to the dead worker
        if not self.fatal:
            self.reconcile()  # a warm spare takes the slot now, not at the next tick
        moved = self.dispatcher.reroute(handle.link)
        level = logging.INFO if handle.draining else logging.WARNING
        self._event("worker_died", level=level, worker=handle.slot, pid=handle.pid,
                    reason=reason, exit_code=code, rerouted=moved)  # fmt: skip
        self.procs.finish(handle)
        self.wake.set()

    # -- reconcile ------------------------------------------------------------------------------
    def reconcile(self) -> None:
        if self.stopping:
            return
        for slot in [s for s in self.slots if s >= self.target]:  # scale down
            self.roster.vacate(slot, "scale")
            del self.slots[slot]
        for slot in range(self.target):
            self._fill(slot)
        self._keep_spares()
        self.roster.update_serving()

    def _fill(self, slot: int) -> None:
        handle = self.slots.get(slot)
        if handle is not None and handle.generation != self.generation:
            if self._ready_spare() is None:  # rolling reload, one slot at a time
                return
            self.roster.vacate(slot, "reload")
            handle = None
        if handle is not None or self.policy.held(slot):
            return
        spare = self._ready_spare(self.device_for(slot))
        if spare is not None:
            self.roster.promote(spare, slot, self.cpus_for(slot))
        elif not self.draining:
            self.slots[slot] = self.spawn(slot)  # None when refused: filled again later

    def _keep_spares(self) -> None:
        want = self.roster.spares_wanted(self.target_spares, self.generation, self.forker.booting)
        if self.draining:
            want = 0
        while len(self.spares) < want and not self.policy.held(SPARE_KEY):
            spare = self.spawn(None)
            if spare is None:
                break
            self.spares.append(spare)

    def _ready_spare(self, device: str | None = None) -> WorkerHandle | None:
        return self.roster.ready_spare(self.generation, device)

    # -- the loop -------------------------------------------------------------------------------
    def check(self) -> None:
        """One pass of watching: the zygote, then every worker (watch.Watch)."""
        if not self.stopping and not self.draining:
            self.forker.tend(self.generation)
        self.watch.check(self.all.values(), self.clock())
        self.warmups.check(self.clock())

    async def run(self) -> None:
        self.procs.loop = asyncio.get_running_loop()
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
        """TERM every worker, KILL what is left, release every segment (Processes.stop)."""
        self.stopping = True
        self.forker.close()
        await self.procs.stop(timeout)

    @property
    def restarts_total(self) -> int:
        return self.roster.restarts_total

    def ready_count(self) -> int:
        return self.roster.ready_count()

    def status_rows(self) -> list[dict[str, Any]]:
        return self.roster.status_rows()

    def _event(self, event: str, level: int = logging.INFO, **fields: Any) -> None:
        emit(self.events, event, level, fields)


def emit(events: EventLog | None, event: str, level: int, fields: dict[str, Any]) -> None:
    """A pool event: to the structured event log (service.logs), else to this module's logger."""
    if events is not None:
        events.emit(event, level=level, **fields)
    else:
        log.log(level, "%s %s", event, fields)
