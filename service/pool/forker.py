"""The zygote workers fork from (--start-method zygote): one live zygote of the current model
generation, started at once, replaced when it dies (backing off while new ones die before they
are ready), and replaced by a new one on a reload. Workers spawn whenever none is ready."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence

from ringserve.service.config.settings import PER_MODEL_SERVED, Config
from ringserve.workers.artifact import ArtifactError, load_manifest
from ringserve.workers.process.zygote import Zygote
from ringserve.workers.runtimes.onnx_model import choose_runtime
from ringserve.workers.spec import ModelRef

ZYGOTE_RETRY_S = 5.0  # a dead zygote is replaced at most this often; workers spawn meanwhile
ZYGOTE_RETRY_MAX_S = 300.0  # ... doubling for each zygote in a row that died before it was ready
ZYGOTE_WAIT_S = 120.0  # at start, workers wait this long for the zygote before spawning


def runs_torch(settings: Config, model_dir: str, on_gpu: bool) -> bool:
    """Whether workers run this model on TorchScript (the zygote then holds its CPU weights
    to share)."""
    try:
        manifest = load_manifest(model_dir, verify=False)
        runtime, _ = choose_runtime(settings.runtime, settings.precision, on_gpu, manifest)
    except (ArtifactError, ValueError):
        return True  # the workers will report the problem themselves
    return runtime == "torch"


def workers_run_torch(settings: Config, model_dirs: Sequence[str], on_gpu: bool) -> bool:
    """Whether workers run any of these models on TorchScript."""
    return any(runs_torch(settings, d, on_gpu) for d in model_dirs)


class Forker:
    def __init__(
        self,
        settings: Config,
        models: tuple[ModelRef, ...],
        model_dir: str,
        on_gpu: bool,
        clock: Callable[[], float],
        emit: Callable[..., None],
    ) -> None:
        self.settings = settings
        self.models = models  # what the next zygote preloads (set_models; empty: model_dir's)
        self.model_dir = model_dir
        self.on_gpu = on_gpu
        self.clock = clock
        self.emit = emit  # Supervisor._event
        self.wanted = settings.start_method == "zygote"
        self.zygote: Zygote | None = None
        self.retry_at = 0.0
        self.failures = 0  # zygotes in a row that died before they were ready
        # The front-end verified the artifacts of the list the next zygote loads (at start, and
        # before a load or reload); a zygote that replaces a dead one verifies them itself.
        self.verified = True

    def start(self, generation: int) -> None:
        dirs = tuple(m.model_dir for m in self.models) or (self.model_dir,)
        # A model's own settings (max_length is the worker's alone, no server option).
        own = [
            dataclasses.replace(
                self.settings, **{k: v for k, v in m.options if k in PER_MODEL_SERVED}
            )
            for m in self.models
        ]
        pairs = zip(own or [self.settings], dirs, strict=True)
        torch = tuple(runs_torch(s, d, self.on_gpu) for s, d in pairs)
        self.zygote = Zygote(dirs, generation, torch, verify=not self.verified)
        self.verified = False
        self.zygote.started_at = self.clock()
        self.retry_at = self.clock() + ZYGOTE_RETRY_S
        self.emit("zygote_started", pid=self.zygote.process.pid, generation=generation)

    def replace(self, reason: str, generation: int) -> None:
        old, self.zygote = self.zygote, None
        if old is not None and not old.announced and reason != "reload":
            # It never became ready: back off, rather than re-import torch every few seconds.
            self.failures += 1
            delay = min(ZYGOTE_RETRY_MAX_S, ZYGOTE_RETRY_S * 2 ** (self.failures - 1))
            self.retry_at = max(self.retry_at, old.started_at + delay)
        if old is not None:
            level = logging.INFO if reason == "reload" else logging.WARNING
            self.emit("zygote_replaced", level=level, pid=old.process.pid, reason=reason)
            old.close()
        if self.clock() >= self.retry_at or reason == "reload":
            self.start(generation)

    def reload(self, generation: int) -> None:
        if self.zygote is not None:  # a new zygote loads the new artifact
            self.verified = True
            self.replace("reload", generation)

    def tend(self, generation: int) -> None:
        """Keep one live zygote for the current generation (when the start method wants one)."""
        if not self.wanted:
            return
        z = self.zygote
        if z is None:
            if self.clock() >= self.retry_at:
                self.start(generation)
        elif not z.alive():
            self.replace("died", generation)
        elif z.poll() and not z.announced:
            z.announced = True
            self.failures = 0
            boot_ms = round((self.clock() - z.started_at) * 1000)
            self.emit("zygote_ready", pid=z.process.pid, boot_ms=boot_ms)

    def ready(self, generation: int) -> Zygote | None:
        """The zygote to fork a worker of this generation from, if one is ready."""
        z = self.zygote
        if z is not None and z.generation == generation and z.poll():
            return z
        return None

    def booting(self) -> bool:
        z = self.zygote
        return z is not None and z.alive() and not z.poll()

    async def wait(self, stopping: Callable[[], bool]) -> None:
        """At start only: forking N workers from a ready zygote beats N cold spawns."""
        deadline = self.clock() + ZYGOTE_WAIT_S
        while self.booting() and self.clock() < deadline and not stopping():
            await asyncio.sleep(0.02)
        if self.zygote is not None and not self.zygote.poll():
            self.emit("zygote_unavailable", level=logging.WARNING, action="spawning workers")

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
