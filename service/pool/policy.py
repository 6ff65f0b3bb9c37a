"""When a gone worker's slot may be filled again: the crash window and its backoff, and the
device-error policy (a GPU that fails its boot is retried, then the slot serves from the CPU).
A model that cannot load is no crash to retry: it stops the server (EXIT_BOOT_ERROR)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ringserve.service.pool.handle import WorkerHandle
from ringserve.workers.spec import EXIT_BOOT_ERROR, EXIT_DEVICE_ERROR

CRASH_WINDOW_S = 30.0
CRASH_LIMIT = 5  # crashes of one slot within the window before restarts back off
STABLE_S = 2.0  # a worker ready this long that dies is not crash-looping (no backoff)
SPARE_KEY = -1  # crash history and backoff of the spares, beside the slots' own
DEVICE_RETRIES = 3  # boots of a slot that fail on its GPU before the slot serves from the CPU
SPAWN_RETRY_S = 0.5  # a spawn refused for want of shared memory is tried again after this ...
SPAWN_RETRY_MAX_S = 10.0  # ... doubling for each refusal in a row, up to this


class RestartPolicy:
    def __init__(self, clock: Callable[[], float], emit: Callable[..., None]) -> None:
        self.clock = clock
        self.emit = emit  # Supervisor._event
        self.crashes: dict[int, list[float]] = {}  # slot (SPARE_KEY: spares) -> recent deaths
        self.backoff_until: dict[int, float] = {}
        self.device_errors: dict[int | None, int] = {}  # slot (None: spares) -> boots failed
        self.refusals: dict[int, int] = {}  # slot (SPARE_KEY) -> spawns refused in a row

    def held(self, key: int) -> bool:
        """Whether the slot (or SPARE_KEY) is backing off now."""
        return self.clock() < self.backoff_until.get(key, 0.0)

    def on_cpu(self, slot: int | None) -> bool:
        """Whether the slot's GPU failed its boot DEVICE_RETRIES times (until the next reload)."""
        return self.device_errors.get(slot, 0) >= DEVICE_RETRIES

    def died(self, handle: WorkerHandle, key: int | None, code: int | None, loaded: bool) -> bool:
        """A worker is gone; `key` is the slot it held (SPARE_KEY for a spare, None when its
        death says nothing of a crash loop). True when its exit stops the server: the model
        cannot load."""
        if key is not None and self.crash_looping(handle):
            self.note_crash(key)
        if code == EXIT_DEVICE_ERROR and not loaded:  # never a server stop
            self.device_error(handle.slot, handle.device)
        return code == EXIT_BOOT_ERROR and not loaded

    def crash_looping(self, handle: WorkerHandle) -> bool:
        """A death counts toward the crash backoff only if the worker died while booting or
        within STABLE_S of being ready: that is a loop to slow down. One that had served longer
        was killed or ran out of memory, and is replaced at once however often that happens
        (forked replacements make back-to-back kills common, and each is ready in ~0.3 s)."""
        return handle.ready_at is None or self.clock() - handle.ready_at < STABLE_S

    def note_crash(self, key: int) -> None:
        now = self.clock()
        recent = [t for t in self.crashes.get(key, []) if now - t < CRASH_WINDOW_S] + [now]
        self.crashes[key] = recent
        if len(recent) >= CRASH_LIMIT:
            delay = min(30.0, 0.5 * 2 ** (len(recent) - CRASH_LIMIT))
            self.backoff_until[key] = now + delay
            self.emit("worker_backoff", level=logging.WARNING, worker=key, delay_s=delay)

    def device_error(self, slot: int | None, device: str) -> None:
        """A boot failed on its GPU: retry after a growing delay, then give the slot the CPU."""
        n = self.device_errors.get(slot, 0) + 1
        self.device_errors[slot] = n
        if slot is not None and n < DEVICE_RETRIES:
            self.backoff_until[slot] = self.clock() + 0.25 * 2 ** (n - 1)
        fallback = "cpu" if n >= DEVICE_RETRIES else device
        fields: dict[str, Any] = {"failures": n, "next_device": fallback}
        self.emit(
            "worker_device_error", level=logging.WARNING, worker=slot, device=device, **fields
        )

    def refused(self, key: int, reason: str, serving: int) -> None:
        """A spawn for `key` could not be made (no room for its segments): say why, and hold
        the key back for a growing delay, so the supervisor neither spins nor gives up (the
        pool serves on with its `serving` workers)."""
        n = self.refusals.get(key, 0) + 1
        self.refusals[key] = n
        delay = min(SPAWN_RETRY_MAX_S, SPAWN_RETRY_S * 2 ** (n - 1))
        self.backoff_until[key] = max(self.backoff_until.get(key, 0.0), self.clock() + delay)
        worker = None if key == SPARE_KEY else key
        self.emit("worker_spawn_refused", level=logging.ERROR, worker=worker, reason=reason,
                  retry_in_s=delay, serving=serving)  # fmt: skip

    def spawned(self, key: int) -> None:
        self.refusals.pop(key, None)

    def reload(self) -> None:
        self.device_errors.clear()  # a reload tries every slot's GPU again
