"""The worker processes themselves: each started (forked from the zygote, else spawned) with
its exit sentinel on the loop and its link (answer doorbell) with the dispatcher, and released
once it is gone; at the end, all stopped together. The dispatcher tells this room, its links'
owner, when a worker's first answer doorbell rings (ready), when a draining one holds nothing
any more (drained), and when one wrote a malformed answer (faulty: it is replaced)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from ringserve.service.config.settings import Config
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.engine.link import WorkerLink
from ringserve.service.pool.handle import WorkerHandle
from ringserve.service.pool.watch import stop_all
from ringserve.workers.process.zygote import Zygote
from ringserve.workers.spec import ModelRef


class Processes:
    def __init__(
        self,
        settings: Config,
        models: tuple[ModelRef, ...],
        model_dir: str,
        dispatcher: Dispatcher,
        make_handle: Callable[..., WorkerHandle],
        on_exit: Callable[[WorkerHandle], None],
        clock: Callable[[], float],
        on_ready: Callable[[WorkerHandle], None] = lambda handle: None,
        on_faulty: Callable[[WorkerHandle, str], None] = lambda handle, reason: None,
    ) -> None:
        self.settings = settings
        self.models = models  # what a worker started now serves (Supervisor.set_models)
        self.model_dir = model_dir
        self.dispatcher = dispatcher
        self.make_handle = make_handle  # WorkerHandle; tests give a fake
        self.on_exit = on_exit  # the sentinel fired (Supervisor.on_exit)
        self.on_ready = on_ready  # a worker's first answer doorbell after it loaded
        self.on_faulty = on_faulty  # a worker is gone, here as lying (Supervisor._failed)
        self.clock = clock
        self.all: dict[int, WorkerHandle] = {}  # serial -> handle, every live process
        self.serial = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        # Called just before a worker's segments are released (metrics keep its last counters).
        self.on_release: Callable[[WorkerHandle], None] | None = None

    def start(
        self,
        slot: int | None,
        cpus: list[int],
        device: str,
        generation: int,
        zygote: Zygote | None,
    ) -> WorkerHandle:
        """A new worker for `slot` (None: a spare), forked from `zygote` when one is given."""
        self.serial += 1
        s = self.settings
        handle = self.make_handle(
            self.serial, cpus, device, self.model_dir, generation, s, self.models
        )
        handle.slot = slot
        handle.start(zygote)
        handle.started_at = self.clock()
        self.all[handle.serial] = handle
        assert self.loop is not None
        self.loop.add_reader(handle.sentinel, self.on_exit, handle)
        self.dispatcher.answers.add(handle.link, self.loop, self)  # its answers are read there
        return handle

    def worker_ready(self, link: WorkerLink) -> None:
        """The dispatcher heard the worker's first answer doorbell after it loaded."""
        handle = self.all.get(link.serial)
        if handle is not None and handle.ready_at is None:
            handle.ready_at = self.clock()
            self.on_ready(handle)

    def worker_drained(self, link: WorkerLink) -> None:
        """A draining worker answered the last it held: it may stop now."""
        handle = self.all.get(link.serial)
        if handle is not None:
            handle.terminate(self.clock())

    def worker_faulty(self, link: WorkerLink, reason: str) -> None:
        """The dispatcher found a malformed record, length or index in the worker's response
        ring: that worker is dead (killed by finish(), replaced, what it held rerouted, as for
        any death; none of its answers of that read was taken)."""
        handle = self.all.get(link.serial)
        if handle is not None:
            self.on_faulty(handle, f"malformed answer: {reason}")

    def finish(self, handle: WorkerHandle) -> None:
        """A worker declared dead: release it, or KILL it first when it still runs (hung)."""
        self.dispatcher.answers.remove(handle.link)
        if handle.process.exitcode is None:
            handle.signal(signal.SIGKILL)  # on_exit releases it once the kernel has freed it
            return
        assert self.loop is not None
        self.loop.remove_reader(handle.sentinel)
        self.release(handle)

    def release(self, handle: WorkerHandle) -> None:
        if self.on_release is not None:
            self.on_release(handle)  # metrics keep its final counters
        self.all.pop(handle.serial, None)
        handle.release()

    async def stop(self, timeout: float) -> None:
        """TERM every worker, KILL what is left (watch.stop_all), release every segment."""
        handles = list(self.all.values())
        assert self.loop is not None
        for h in handles:  # from here on this method alone reaps and releases
            self.dispatcher.answers.remove(h.link)
            self.loop.remove_reader(h.sentinel)
        await stop_all(handles, self.clock(), timeout)
        for h in handles:
            h.mark_dead()
            self.release(h)
