"""A roll onto a new model list (the repository's load, unload and reload): its generation,
whether a load's boot errors fail it (tentative), and the wait for it to end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from ringserve.service.pool.handle import WorkerHandle

ROLL_POLL_S = 0.02  # how often a load or unload looks whether its roll has ended
# A roll boots each worker in turn (seconds each from the zygote, a minute or more spawned
# on a busy machine): ten minutes is far past any healthy one.
ROLL_TIMEOUT_S = 600.0


class Pool(Protocol):
    """What a roll reads of the supervisor."""

    @property
    def target(self) -> int: ...
    @property
    def slots(self) -> Mapping[int, WorkerHandle | None]: ...
    @property
    def fatal(self) -> str | None: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def draining(self) -> bool: ...


class Rolls:
    """The rolls the supervisor runs: which generation is a load's (tentative), and why a roll
    cannot finish."""

    def __init__(self, pool: Pool, clock: Callable[[], float]) -> None:
        self.pool = pool
        self.clock = clock
        self.tentative: int | None = None  # a load's generation: its boot errors fail the load
        self.failed: dict[int, str] = {}  # generation -> why its roll cannot finish

    def started(self, generation: int, tentative: bool) -> None:
        self.tentative = generation if tentative else None

    def boot_failed(self, generation: int, code: int | None) -> bool:
        """A worker of `generation` could not load its models: True when that fails a load
        (the previous list's workers still serve), not the server."""
        if generation != self.tentative:
            return False
        self.failed[generation] = (
            f"a worker could not load the models (exit code {code}); see its error"
        )
        return True

    def done(self, generation: int) -> bool:
        """Every serving slot holds a loaded worker of `generation` (or later)."""
        for slot in range(self.pool.target):
            handle = self.pool.slots.get(slot)
            if handle is None or handle.generation < generation or not handle.loaded():
                return False
        return True

    async def wait(self, generation: int, timeout: float = ROLL_TIMEOUT_S) -> str | None:
        """Wait for the roll onto `generation` to end; the reason when it cannot."""
        pool = self.pool
        deadline = self.clock() + timeout
        while not self.done(generation):
            if pool.fatal:
                return pool.fatal
            if generation in self.failed:
                return self.failed.pop(generation)
            if pool.stopping or pool.draining:
                return "server is draining"
            if self.clock() > deadline:
                return f"the workers did not all restart within {timeout:.0f} s"
            await asyncio.sleep(ROLL_POLL_S)
        if self.tentative == generation:  # it loaded: its workers' failures mean what they did
            self.tentative = None
        return None
