"""The one place the front-end enforces a request's deadline: a timer on the event loop that,
while requests are in flight, asks the dispatcher every EXPIRE_EVERY_S to answer 504 for each
request whose deadline passed on the dispatcher's clock. (A worker's batcher may still drop a
text that expired before its batch; the front-end answers it here.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

EXPIRE_EVERY_S = 0.05


class ExpiryTimer:
    def __init__(self, expire: Callable[[], object], busy: Callable[[], bool]) -> None:
        self.expire = expire  # Dispatcher.expire at the dispatcher's clock's now
        self.busy = busy  # requests are in flight
        self.handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """Start ticking, unless it is already. Only inside a running loop: the in-process
        tests call Dispatcher.expire themselves, with their own clock."""
        if self.handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.handle = loop.call_later(EXPIRE_EVERY_S, self.due)

    def due(self) -> None:
        self.handle = None
        self.expire()
        if self.busy():
            self.arm()
