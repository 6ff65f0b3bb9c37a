"""One gRPC call's answer, handed from the loop to the thread that waits for it. Apart from
servicer.py so that it imports no protobuf messages: a process that also imports tritonclient's
(both define the package `inference`) can still use it (tests/unit/test_grpc_reply.py)."""

from __future__ import annotations

import threading
from typing import Any


class Reply:
    """One call's answer, handed from the loop to the gRPC thread that waits for it: a lock
    the thread blocks on, released once with the answer or the error (cheaper than a
    concurrent future: no condition, no callbacks)."""

    __slots__ = ("error", "lock", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.value: Any = None
        self.error: BaseException | None = None

    def give(self, value: Any) -> None:
        self.value = value
        self.lock.release()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.lock.release()

    def wait(self) -> Any:
        """On the gRPC thread: the answer, or the error raised."""
        self.lock.acquire()
        if self.error is not None:
            raise self.error
        return self.value
