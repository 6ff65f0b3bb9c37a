"""A roll onto a new model list (the repository's load, unload and reload): its generation,
whether it is tentative, and the wait for it to end.

A tentative roll (every roll the repository asks for) serves its new list only once a worker
has loaded it and answered a warm-up (service/pool/warmup.py): until then its workers take no
place and no text, and the old list's workers serve. A worker of it that cannot load, fails
its warm-up, or dies before that fails the roll (never the server); the caller then rolls back
(Supervisor.roll_back): the old list's workers are kept, as a generation of their own, and
everything the failed roll started goes. That kept generation stays tentative: a worker started
for it later (after a death) loads whatever its directory holds now, and serves only after its
own warm-up, so a broken artifact left on disk never serves and never stops the server."""

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
        self.tentative: int | None = None  # its workers serve once warm; its failures fail it
        self.warm: set[int] = set()  # serials of the tentative generation's workers that may serve
        self.kept: int | None = None  # a roll back's generation: tentative, awaited by nobody
        self.failed: dict[int, str] = {}  # generation -> why its roll cannot finish

    def started(self, generation: int, tentative: bool) -> None:
        """A roll onto `generation` began."""
        self.tentative = generation if tentative else None
        self.warm.clear()
        self.kept = None

    def keep(self, generation: int, serials: frozenset[int]) -> None:
        """A roll back: `generation` serves the list before a failed roll, on the workers
        `serials`. It stays tentative (a worker started for it later serves once warm), and
        what its later workers fail fails nothing (nobody waits for it) and stops nothing."""
        self.tentative = self.kept = generation
        self.warm = set(serials)

    def admits(self, handle: WorkerHandle) -> bool:
        """Whether a loaded worker may take a place: any, but one of a tentative roll only once
        it answered its warm-up."""
        return handle.generation != self.tentative or handle.serial in self.warm

    def fail(self, generation: int, reason: str) -> bool:
        """A worker of `generation` cannot serve it: True when that fails a tentative roll (the
        previous list's workers still serve), not the server."""
        if generation != self.tentative:
            return False
        if generation != self.kept:
            self.failed.setdefault(generation, reason)
        return True

    def boot_failed(self, generation: int, code: int | None) -> bool:
        """A worker of `generation` could not load its models: True when that is no reason to
        stop the server (a worker of a tentative roll, or of a roll back's kept generation)."""
        why = f"a worker could not load the models (exit code {code}); see its error"
        return self.fail(generation, why)

    def stops_server(self, generation: int, current: int, code: int | None) -> bool:
        """A worker of `generation` could not load its models: whether that stops the server.
        Only a worker of the `current` generation outside a tentative roll does (the start's, a
        plain reload's); one of a tentative roll fails that roll, and one of a past generation
        (a failed roll's, started before its roll back) was on its way out anyway."""
        return generation == current and not self.boot_failed(generation, code)

    def done(self, generation: int) -> bool:
        """Every serving slot holds a loaded worker of `generation` (or later) that serves."""
        for slot in range(self.pool.target):
            handle = self.pool.slots.get(slot)
            if handle is None or handle.generation < generation or not handle.loaded():
                return False
            if not self.admits(handle):
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
        if self.tentative == generation:  # it serves: its workers' failures mean what they did
            self.tentative = None
            self.warm.clear()
        return None
