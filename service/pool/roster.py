"""Who holds which place in the pool now: the serving slots, the spares and the retiring
workers, and how often each slot's process was replaced. The supervisor's reconcile moves this
toward its desired set (service.pool.supervisor); the control status and metrics read it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.pool.handle import WorkerHandle, status_row
from ringserve.service.pool.policy import SPARE_KEY


class Roster:
    def __init__(
        self,
        dispatcher: Dispatcher,
        clock: Callable[[], float],
        emit: Callable[..., None],
        admits: Callable[[WorkerHandle], bool] = lambda handle: True,
    ) -> None:
        self.dispatcher = dispatcher
        self.clock = clock
        self.emit = emit  # Supervisor._event
        # Whether a loaded worker may serve yet (Rolls.admits: a tentative roll's, once warm).
        self.admits = admits
        self.slots: dict[int, WorkerHandle | None] = {}  # slot -> its serving worker
        self.spares: list[WorkerHandle] = []  # starting or loaded, not serving
        self.retiring: list[WorkerHandle] = []  # draining or stopping
        self.restarts: dict[int, int] = {}  # slot -> times its process was replaced
        self.restarts_total = 0

    def count_restart(self, slot: int) -> None:
        self.restarts[slot] = self.restarts.get(slot, 0) + 1
        self.restarts_total += 1

    def vacate(self, slot: int, reason: str) -> None:
        """Empty the slot; its worker retires."""
        handle = self.slots.get(slot)
        if handle is not None:
            self.slots[slot] = None
            self.retire(handle)
            self.emit("worker_retire", worker=slot, pid=handle.pid, reason=reason)
        self.update_serving()

    def retire(self, handle: WorkerHandle) -> None:
        """Stop sending it work; it is stopped once what it holds is answered."""
        handle.drain()
        if handle not in self.retiring:
            self.retiring.append(handle)
        if not handle.link.assigned:
            handle.terminate(self.clock())

    def take_out(self, handle: WorkerHandle, stopping: bool) -> int | None:
        """Remove a gone worker; the key its death counts under in the crash backoff (its
        slot, SPARE_KEY for a spare), or None when it says nothing of one."""
        if handle in self.spares:
            self.spares.remove(handle)
        if handle in self.retiring:
            self.retiring.remove(handle)
        slot = handle.slot
        if slot is not None and self.slots.get(slot) is handle:
            self.slots[slot] = None
            self.count_restart(slot)
            return slot
        if slot is None and not handle.draining and not stopping:
            return SPARE_KEY  # a crash-looping spare backs off like a slot
        return None

    def update_serving(self) -> None:
        """Tell the dispatcher which workers take new requests."""
        serving = [h.link for h in self.slots.values() if h is not None and self.serves(h)]
        self.dispatcher.set_serving(serving, whole=len(serving) == len(self.slots))

    def spares_wanted(self, want: int, generation: int, zygote_booting: Callable[[], bool]) -> int:
        """How many spares to keep: `want` (--spares), at least one while a slot holds an older
        generation (a reload needs somewhere to roll to), and no more than there are while a
        serving worker or the zygote boots (serving workers boot first; spares wait for a
        booting zygote: fast forks)."""
        slots = self.slots.values()
        if any(h is not None and h.generation != generation for h in slots):
            want = max(1, want)
        booting = any(h is not None and not h.loaded() for h in slots)
        if booting or zygote_booting():
            want = min(want, len(self.spares))
        return want

    def keep(self, handles: Iterable[WorkerHandle], old: int, new: int) -> frozenset[int]:
        """A roll back: the live workers of generation `old` are taken as `new` (they hold the
        list it serves again), and every other spare and serving worker retires. Answers the
        serials kept."""
        kept = [h for h in handles if h.generation == old and not h.dead]
        for h in kept:
            h.generation = new
        for h in [h for h in self.spares if h.generation != new]:
            self.spares.remove(h)
            self.retire(h)
        for slot, held in list(self.slots.items()):
            if held is not None and held.generation != new:
                self.vacate(slot, "roll back")
        return frozenset(h.serial for h in kept)

    def ready_spare(self, generation: int, device: str | None = None) -> WorkerHandle | None:
        """A loaded spare of this generation (on `device` when given: spares are per GPU)."""
        for h in self.spares:
            fresh = h.loaded() and h.generation == generation and not h.dead and self.admits(h)
            if fresh and (device is None or h.device == device):
                return h
        return None

    def promote(self, spare: WorkerHandle, slot: int, cpus: list[int]) -> None:
        self.spares.remove(spare)
        spare.slot = slot
        spare.pin(cpus)
        self.slots[slot] = spare
        self.emit("worker_promoted", worker=slot, pid=spare.pid)

    # -- views ----------------------------------------------------------------------------------
    def handles(self) -> list[tuple[int | None, WorkerHandle]]:
        out: list[tuple[int | None, WorkerHandle]] = [
            (s, h) for s, h in sorted(self.slots.items()) if h is not None
        ]
        out += [(None, h) for h in self.spares]
        out += [(h.slot, h) for h in self.retiring if not h.dead]
        return out

    def serves(self, h: WorkerHandle) -> bool:
        return h.serving() and self.admits(h)

    def ready_count(self) -> int:
        return sum(1 for h in self.slots.values() if h is not None and self.serves(h))

    def status_rows(self) -> list[dict[str, Any]]:
        return [status_row(s, h, self.restarts.get(s, 0) if s is not None else 0)
                for s, h in self.handles()]  # fmt: skip
