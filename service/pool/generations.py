"""The model list the pool serves, and its generations: every worker is started for the current
generation, and reconcile replaces, one at a time, each worker of an older one. A reload (the
same list read again), a roll onto a new list (set_models) and the way back from a tentative
roll that failed (roll_back) each make a new generation; roll.py says when a roll has ended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from ringserve.service.pool.forker import Forker
from ringserve.service.pool.policy import RestartPolicy
from ringserve.service.pool.processes import Processes
from ringserve.service.pool.roll import Rolls
from ringserve.service.pool.roster import Roster
from ringserve.workers.spec import ModelRef


class Generations:
    def __init__(
        self,
        models: tuple[ModelRef, ...],
        model_dir: str,
        forker: Forker,
        procs: Processes,
        roster: Roster,
        policy: RestartPolicy,
        rolls: Rolls,
        emit: Callable[..., None],
        wake: asyncio.Event,
    ) -> None:
        self.generation = 0
        self.models = models  # what a worker started now serves (empty: model_dir's one)
        self.model_dir = model_dir
        self.forker, self.procs, self.roster = forker, procs, roster
        self.policy, self.rolls = policy, rolls
        self.emit = emit  # Supervisor._event
        self.wake = wake  # the supervisor's loop: reconcile now

    def reload(self) -> None:
        """Bump the generation: reconcile then replaces every worker, one at a time."""
        self.generation += 1
        self.forker.reload(self.generation)
        self.policy.reload()
        for h in list(self.roster.spares):  # spares carry the old model: replace them at once
            self.roster.spares.remove(h)
            self.roster.retire(h)
        self.emit("reload", generation=self.generation)
        self.wake.set()

    def set_models(self, models: Sequence[ModelRef], tentative: bool = False) -> int:
        """Serve `models` from now on: a new zygote preloads them and every worker is replaced
        by one that holds them, one at a time, dropping nothing (reload). Answers the roll's
        generation, for rolls.wait(). `tentative` (the repository's rolls): the new list serves
        only once a worker has loaded it and answered a warm-up; a worker that cannot fails the
        roll (rolls.wait() says why; the caller rolls back) instead of stopping the server,
        while the previous list's workers still serve (roll.py)."""
        self.point(models)
        self.reload()
        self.rolls.started(self.generation, tentative)
        return self.generation

    def roll_back(self, models: Sequence[ModelRef], failed: int) -> int:
        """The tentative roll onto generation `failed` did not finish: serve `models` (the
        list before it) again, on the workers of the generation before that, which hold them,
        kept as a new generation; what the failed roll started goes. Answers it."""
        self.point(models)
        self.generation += 1
        kept = self.roster.keep(self.procs.all.values(), failed - 1, self.generation)
        self.forker.reload(self.generation)
        self.rolls.keep(self.generation, kept)  # a later worker of it serves once warm
        self.emit("roll_back", level=logging.WARNING, generation=self.generation,
                  failed=failed, kept=len(kept))  # fmt: skip
        self.wake.set()
        return self.generation

    def point(self, models: Sequence[ModelRef]) -> None:
        """What the next worker and zygote load."""
        refs = tuple(models)
        if not refs:
            raise ValueError("a pool serves at least one model")
        self.models = self.forker.models = self.procs.models = refs
        self.model_dir = self.forker.model_dir = self.procs.model_dir = refs[0].model_dir
