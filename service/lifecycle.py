"""The lifecycle of one running server: signals, the stop (a shutdown delay, then the drain),
a hurried stop, the sweep of slow and idle connections, reloads, and what the control socket
may do (`Admin`). Signal handlers only record the signal; the work runs on the event loop.

Stop (SIGTERM, SIGINT or `drain`): readiness turns 503; after --shutdown-delay-s the listeners
close and every idle connection with them; what is in flight is answered within the drain
timeout; then the workers stop TERM then KILL, and what this server made is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import traceback
from multiprocessing import resource_tracker
from typing import Any

from ringserve.service.config.settings import Config, ModelTableError
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.front import Front, RunState
from ringserve.service.logs import EventLog
from ringserve.service.models.reload import ModelTables
from ringserve.service.models.repository import Repository
from ringserve.service.notify import sd_notify
from ringserve.service.pool.supervisor import Supervisor
from ringserve.service.ports import Ports
from ringserve.shm import segment
from ringserve.workers.artifact import ArtifactError, load_manifest

SWEEP_S = 0.25
STOP_GRACE_S = 5.0  # workers' time to exit on SIGTERM before SIGKILL
HURRY_GRACE_S = 0.5  # the same after a second SIGINT/SIGTERM
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Lifecycle:
    def __init__(
        self,
        settings: Config,
        log: EventLog,
        front: Front,
        dispatcher: Dispatcher,
        supervisor: Supervisor,
        ports: Ports,
    ) -> None:
        self.settings = settings
        self.log = log
        self.front = front
        self.state: RunState = front.state
        self.dispatcher = dispatcher
        self.supervisor = supervisor
        self.ports = ports
        self.reloader = Reloader(log, front, supervisor)
        self.tasks: set[asyncio.Task[Any]] = set()  # started by signal handlers, kept alive
        self.stop_reason: str | None = None
        self.stop_event: asyncio.Event | None = None  # set in run(): the server is running

    # -- signals --------------------------------------------------------------------------------
    def install_signals(self) -> None:
        start_resource_tracker()  # first, while SIGHUP is not ours yet
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.on_stop_signal, signal.Signals(sig).name)
        loop.add_signal_handler(signal.SIGHUP, self.on_reload_signal)

    def remove_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (*STOP_SIGNALS, signal.SIGHUP):
            loop.remove_signal_handler(sig)

    def on_stop_signal(self, name: str) -> None:
        """The first SIGINT or SIGTERM drains; a second one stops at once."""
        if self.state.stopping:
            self.stop_now(name)
        else:
            self.request_stop(name)

    def on_reload_signal(self) -> None:
        self.keep(asyncio.create_task(self.reloader.reload("SIGHUP")))

    def keep(self, task: asyncio.Task[Any]) -> None:
        self.tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self.tasks.discard)

    # -- the stop -------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Readiness turns 503 at once; the drain begins after --shutdown-delay-s, so that load
        balancers stop sending before the listeners close, while we still serve what comes."""
        if self.stop_event is None or self.state.stopping:
            return
        self.state.stopping = True
        self.stop_reason = reason
        # What was read before the signal is answered: framed and admitted now if it waited
        # for a turn, and never refused for the queue's delay from here (docs/api.md, Signals).
        self.ports.stopping()
        self.front.admission.keep_admitted()
        sd_notify("STOPPING=1")
        delay = self.settings.shutdown_delay_s
        self.log.info("stopping", reason=reason, shutdown_delay_s=delay)
        if self.ports.grpc is not None:  # health says NOT_SERVING now, as readiness answers 503
            self.ports.grpc.update_health()
        asyncio.get_running_loop().call_later(max(0.0, delay), self.stop_event.set)

    def stop_now(self, reason: str) -> None:
        """No shutdown delay, no waiting for what is owed (it is answered 500), workers killed;
        the clean-up still runs: workers reaped, segments and the control socket removed."""
        if self.state.hurry or self.stop_event is None:
            return
        self.state.hurry = True
        self.log.warning("stop_now", reason=reason, inflight=self.dispatcher.depth)
        self.stop_event.set()
        if self.supervisor.stopping:  # already stopping the workers: do not wait for them
            for handle in list(self.supervisor.all.values()):
                handle.signal(signal.SIGKILL)

    async def until_stopped(self, sup: asyncio.Task[Any]) -> int:
        """Wait for a stop (or the supervisor's end), drain, and say the exit code."""
        assert self.stop_event is not None
        stop_wait = asyncio.create_task(self.stop_event.wait())
        await asyncio.wait([sup, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        code = 0
        fatal = self.supervisor.fatal or self.crash(sup)
        if fatal:
            self.log.error("fatal", reason=fatal)
            print(f"ringserve: {fatal}", file=sys.stderr)
            code = 1
        await self.drain()
        return code

    @staticmethod
    def crash(sup: asyncio.Task[Any]) -> str:
        """Why the supervisor's task ended by raising ("" when it did not): a defect, said
        with its traceback and ended with exit 1, never a silent exit 0."""
        if not sup.done() or sup.cancelled() or sup.exception() is None:
            return ""
        exc = sup.exception()
        trace = "".join(traceback.format_exception(exc))
        return f"the supervisor failed: {exc!r}\n{trace}"

    async def drain(self) -> None:
        """Close the listeners and every idle connection, serve what is owed (each answer with
        `connection: close`), and end as soon as nothing is owed or at the drain timeout. Then
        stop the workers and remove what this server made."""
        self.log.info("drain", reason=self.stop_reason, inflight=self.dispatcher.depth)
        self.state.draining = True
        self.supervisor.draining = True  # no worker is started from here on
        self.ports.begin_drain(self.settings.drain_timeout_s)
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while self.owed() and time.monotonic() < deadline and not self.supervisor.fatal:
            if self.state.hurry:
                break
            await asyncio.sleep(0.01)
        self.dispatcher.stop_accepting()
        if self.dispatcher.depth:
            self.log.warning("drain_timeout", unanswered=self.dispatcher.depth)
            self.dispatcher.fail_all()
        await asyncio.sleep(0)  # let the last answers reach their transports
        self.ports.close_connections()
        if self.ports.grpc is not None:
            await self.ports.grpc.close()
        await self.supervisor.stop(HURRY_GRACE_S if self.state.hurry else STOP_GRACE_S)
        await self.end_tracing()
        self.ports.remove_control()
        stop_resource_tracker()
        left = segment.list_segments(os.getpid())
        if left:
            self.log.warning("segments_left", names=left)

    def owed(self) -> bool:
        """Something is still owed: a request in flight, an answer unwritten, or a request
        being read. An idle connection owes nothing and never holds the exit back."""
        return bool(self.dispatcher.depth) or self.ports.owed()

    async def end_tracing(self) -> None:
        tracing = self.front.admission.tracing
        if tracing is not None:  # the last spans, off the loop, bounded
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(tracing.shutdown), 3.0)

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.ports.sweep(time.monotonic(), time.monotonic_ns())


class Reloader:
    """SIGHUP and `reload`: the key file, then the artifact, verified, then a rolling restart."""

    def __init__(self, log: EventLog, front: Front, supervisor: Supervisor) -> None:
        self.log = log
        self.front = front
        self.supervisor = supervisor
        self.reloading: asyncio.Future[str | None] | None = None  # one reload at a time
        self.tables: ModelTables | None = None  # --config's model tables, from the first reload

    async def reload(self, reason: str) -> str | None:
        """Re-read and verify the artifact (hashing it in a thread, off the loop), then roll
        every worker onto it; the error, if any. A reload asked for during one shares it."""
        if self.front.draining:
            return "server is draining"
        if self.reloading is None:
            self.reloading = asyncio.ensure_future(self._reload(reason))
            self.reloading.add_done_callback(lambda _: setattr(self, "reloading", None))
        return await asyncio.shield(self.reloading)

    async def _reload(self, reason: str) -> str | None:
        keys = self.front.keys
        if keys is not None:  # a bad key file refuses the whole reload: nothing changes
            error = keys.reload()
            if error is not None:
                self.log.error("reload_refused", reason=error, by=reason)
                return f"reload refused: {error}"
            self.log.info("keys_reloaded", keys=len(keys.entries), by=reason)
        repository = self.front.repository
        if repository is not None and repository.settings.config:  # the file's model tables
            if self.tables is None:
                self.tables = ModelTables(repository, self.log)
            error = await self.tables.reload(reason)
            if error is not None:
                self.log.error("reload_refused", reason=error, by=reason)
                return error
        if repository is not None:  # every model re-verified, one roll (models/repository.py)
            error = await repository.reload(reason)
            if error is not None:
                self.log.error("reload_refused", reason=error, by=reason)
            return error
        return await self.reload_one(reason)

    async def reload_one(self, reason: str) -> str | None:
        """The one model, without a repository (a Front built alone)."""
        model = self.front.model
        try:
            manifest = await asyncio.to_thread(load_manifest, model.model_dir)
        except ArtifactError as exc:
            self.log.error("reload_refused", reason=str(exc), by=reason)
            return str(exc)
        old = model.manifest
        if (manifest.labels, manifest.task, manifest.dimension) != (
            old.labels,
            old.task,
            old.dimension,
        ):
            msg = (
                "reload refused: the new artifact's labels, tasks or dimension differ "
                "(restart the server instead)"
            )
            self.log.error("reload_refused", reason=msg, by=reason)
            return msg
        if self.front.draining:  # began while the artifact was being read
            return "server is draining"
        try:
            self.front.model = model.reloaded(manifest)
        except ModelTableError as exc:
            self.log.error("reload_refused", reason=str(exc), by=reason)
            return f"reload refused: {exc}"
        self.supervisor.reload()
        return None


class Admin:
    """What the control socket may do to the server (protocols/control.py's Admin); each
    method answers the error, if any."""

    def __init__(self, life: Lifecycle) -> None:
        self.life = life
        self.supervisor = life.supervisor
        self.state = life.state

    def status(self) -> dict[str, Any]:
        model = self.life.front.model
        return {
            "uptime_s": round(time.monotonic() - self.state.started, 3),
            "queue_depth": self.life.dispatcher.depth,
            "draining": self.state.draining,
            "restarts_total": self.supervisor.restarts_total,
            "model": {"name": model.name, "fingerprint": model.manifest.fingerprint},
            "models": repo.status_rows() if (repo := self.life.front.repository) else [],
            "workers": self.supervisor.status_rows(),
        }

    def repository(self) -> Repository:
        repository = self.life.front.repository
        assert repository is not None  # App.prepare builds it
        return repository

    def models(self) -> list[dict[str, str]]:
        return self.repository().index()

    async def load(self, name: str, version: int | str | None) -> tuple[int, str] | None:
        return await self.repository().load(name, version)

    async def unload(self, name: str) -> tuple[int, str] | None:
        return await self.repository().unload(name)

    def restart(self, slot: int) -> str | None:
        if self.state.draining:
            return "server is draining"
        if not self.supervisor.restart(slot):
            return f"no serving worker with id {slot}"
        return None

    def scale(self, workers: int) -> str | None:
        if self.state.draining:
            return "server is draining"
        self.supervisor.scale(workers)
        return None

    def stop(self, reason: str) -> None:
        self.life.request_stop(reason)

    async def reload(self, reason: str) -> str | None:
        return await self.life.reloader.reload(reason)

    def generation(self) -> int:
        return self.supervisor.generation

    def handover_sockets(self) -> tuple[list[str], list[int]] | str:
        if self.state.draining:
            return "server is draining: its listeners are closed"
        return self.life.ports.handover_sockets()


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, ignoring SIGHUP. It is started with the
    first spawned process and ignores SIGINT and SIGTERM only, so a SIGHUP to the server's group
    (a reload) killed it: it was started again, empty, and printed a KeyError for each segment
    unlinked after. An ignored signal stays ignored across exec; one the loop handles would
    not, so this runs before install_signals takes SIGHUP."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


def stop_resource_tracker() -> None:
    """multiprocessing starts a resource tracker with the first spawned process; it exits when
    we do, and would stay a zombie until init reaps it. Stop and reap it here (we track no
    resource with it: our segments are ours to unlink)."""
    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # private, since 3.8
    if stop is not None:
        with contextlib.suppress(OSError, ChildProcessError):
            stop()
