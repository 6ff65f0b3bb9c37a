"""The engine's channel to one worker process (WorkerLink): the request ring and the doorbell
posted once per request, the response ring and the answer eventfd the dispatcher reads, the
models the worker serves, and the requests handed to it and not yet answered.

The pool owns the process (service.pool.handle.WorkerHandle: start, signal, reap, pin, rss)
and makes its link; the engine reads and writes only the link. The pool tells the engine what
changed through calls: drain() (take no new work), lose() (the process is gone)."""

from __future__ import annotations

from ringserve.service.engine.requests import Request
from ringserve.shm import layout as L
from ringserve.shm.channel import Channel, Doorbells
from ringserve.shm.ring import Message


class WorkerLink:
    """One worker's rings and doorbells as the engine uses them."""

    def __init__(self, serial: int, channel: Channel, bells: Doorbells, models: frozenset[int]):
        self.serial = serial  # the worker's, as the pool names it
        self.channel = channel
        self.bells = bells
        self.requests = channel.requests
        self.responses = channel.responses
        self.ctl = channel.ctl
        self.doorbell = bells.request
        self.eventfd = bells.answer
        self.models = models  # the model wire indexes it serves: only their texts go to it
        self.assigned: dict[int, Request] = {}  # msg id -> request, in dispatch order
        self.draining = False  # takes no new work; its owner is told once it holds none
        self.gone = False  # its process is gone: its doorbell says nothing more

    @classmethod
    def open(
        cls,
        server_pid: int,
        serial: int,
        req_slots: int,
        rsp_slots: int,
        models: frozenset[int],
        predictable: bool = False,
    ) -> WorkerLink:
        """Create the worker's segments and doorbells (it attaches to them at start); raises
        shm.segment.SegmentError, leaving nothing, when /dev/shm has no room for them.
        `predictable`: test-only (shm.segment.unique_names)."""
        channel = Channel.create(server_pid, serial, req_slots, rsp_slots, predictable)
        try:
            bells = Doorbells()
        except BaseException:
            channel.close()
            channel.unlink()
            raise
        return cls(serial, channel, bells, models)

    def submit(self, messages: list[Message]) -> int:
        """Write requests into the ring and post the doorbell once per request written (one
        write of n to the semaphore eventfd)."""
        n = self.requests.write_many(messages)
        if n:
            self.doorbell.release(n)
        return n

    def loaded(self) -> bool:
        """The worker said it is ready (or ready on the CPU only)."""
        return self.ctl.get("state") in (L.W_READY, L.W_DEGRADED)

    def drain(self) -> None:
        """The pool retires the worker: it takes no new work."""
        self.draining = True

    def lose(self) -> None:
        """The pool declared the worker's process dead."""
        self.gone = True

    def release(self) -> None:
        """Close and unlink the segments and doorbells (after the worker has exited)."""
        self.channel.close()
        self.channel.unlink()
        self.bells.close()
