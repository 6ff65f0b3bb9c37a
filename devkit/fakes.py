"""Stand-ins at the edges of in-process protocol tests: a transport that records what the
protocol writes, and a clock the test moves by hand. Everything they are plugged into is the
production code."""

from __future__ import annotations

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
