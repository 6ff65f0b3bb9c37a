"""A reload verifies the artifact (reads and hashes the real default artifact) off the event
loop, once for asks that come together (moved out of tests/unit/test_clock.py: it needs the
built default model)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class Rolls:
    """Stands in for the supervisor: counts the rolls a reload asks for."""

    def __init__(self) -> None:
        self.generation = 0
        self.rolls = self  # the supervisor's rolls (pool/roll.py): wait() for a roll's end

    def reload(self) -> None:
        self.generation += 1

    def set_models(self, models: Any, tentative: bool = False) -> int:
        self.reload()
        return self.generation

    async def wait(self, generation: int) -> str | None:
        return None


def test_reload_hashes_the_artifact_off_the_loop_once_for_concurrent_asks(
    default_model: str, monkeypatch: Any
) -> None:
    import asyncio
    import threading

    from ringserve.service import lifecycle
    from ringserve.service.config.settings import Config
    from ringserve.service.logs import EventLog
    from ringserve.service.models import repository
    from ringserve.service.models.info import ModelInfo
    from ringserve.service.models.modelset import ModelSet
    from ringserve.workers.artifact import load_manifest

    threads: list[threading.Thread] = []

    def recording(path: str) -> Any:
        threads.append(threading.current_thread())
        return load_manifest(path)  # the real check: read and hash the real artifact

    monkeypatch.setattr(repository, "load_manifest", recording)
    model = ModelInfo(load_manifest(default_model), default_model, None, "cpu", "torch", {}, (), ())
    front: Any = SimpleNamespace(models=ModelSet(model), keys=None, draining=False)
    supervisor: Any = Rolls()
    log = EventLog("error")
    # The server's own path: the Reloader asks the Repository, which re-verifies every model.
    dispatcher: Any = None  # a reload uses none
    front.repository = repository.Repository(Config(), log, front, dispatcher, supervisor)
    server = lifecycle.Reloader(log, front, supervisor)

    async def two_asks() -> list[str | None]:
        return list(await asyncio.gather(server.reload("a"), server.reload("b")))

    assert asyncio.run(two_asks()) == [None, None]
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    assert supervisor.generation == 1  # one verification, one roll
