"""Stand-ins at the edges of in-process protocol tests: a transport that records what the
protocol writes, a clock the test moves by hand, a worker's ring that answers when told, and a
callback that keeps what it is given. Everything they are plugged into is the production code."""

from __future__ import annotations

from typing import Any

import numpy as np
from ringserve.shm import layout as L

S = 1_000_000_000  # ns in a second


class Clock:
    def __init__(self) -> None:
        self.now = 10 * S  # any start will do; not 0, which the protocols read as "unset"

    def __call__(self) -> int:
        return self.now


class Transport:
    """Records what the protocol writes and whether it closed, aborted or paused reading. It
    cannot half-close (`can_write_eof` is False), so a protocol that is done closes it."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.aborted = False
        self.reading = True

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return False


class RingWorker:
    """Stands in for a worker's link: a request ring of `room` slots and its answers, written
    as the worker process would (every text label `label`, scores 0.25 and 0.75)."""

    def __init__(self, room: int = 1000, models: frozenset[int] = frozenset({0})) -> None:
        self.room = room
        self.models = models  # the model indexes it serves (WorkerHandle.models)
        self.assigned: dict[int, object] = {}
        self.ring: list[tuple[int, bytes, int, int]] = []  # msg id, text, deadline, meta
        self.answers: list[tuple[int, int, int, bytes]] = []
        self.eventfd = self
        self.responses = self

    def submit(self, messages: list[tuple[int, bytes, int, int]]) -> int:
        n = min(len(messages), self.room - len(self.ring))
        self.ring += messages[:n]
        return n

    def answer(self, label: int = 1) -> None:
        """Answer everything in the ring (as the worker process would, through its ring)."""
        batch = L.pack_batch(len(self.ring), 16, 1)  # one batch of them, padded to 16 tokens
        for msg_id, *_ in self.ring:
            scores = np.array([0.25, 0.75], dtype="<f4").tobytes()
            head = L.pack_response(L.STATUS_OK, 0, label, 2, queued_us=5, model_us=7)
            self.answers.append((msg_id, batch, 0, head + scores))
        self.ring.clear()

    def drain(self) -> None:  # the eventfd
        pass

    def read(self) -> list[tuple[int, int, int, bytes]]:  # the response ring
        out, self.answers = self.answers, []
        return out


class Calls:
    """A group's callback: keeps every list of results it is given."""

    def __init__(self) -> None:
        self.results: list[list[Any]] = []

    def __call__(self, results: list[Any]) -> None:
        self.results.append(results)
