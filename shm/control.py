"""A worker's control block: its heartbeat, state and counters, read by the front-end."""

from __future__ import annotations

import time

from ringserve.shm import layout as L
from ringserve.shm.segment import Segment


class ControlBlock:
    def __init__(self, segment: Segment, create: bool = False) -> None:
        self.segment = segment
        self.words = segment.buf[: L.CONTROL_BYTES].cast("q")
        if create:
            self.words[L.CTL["magic"]] = L.MAGIC_CONTROL
            self.words[L.CTL["version"]] = L.VERSION
        elif self.words[L.CTL["magic"]] != L.MAGIC_CONTROL:
            raise ValueError(f"segment {segment.name} is not a control block")

    def get(self, name: str) -> int:
        return self.words[L.CTL[name]]

    def set(self, name: str, value: int) -> None:
        self.words[L.CTL[name]] = value

    def add(self, name: str, value: int) -> None:
        i = L.CTL[name]
        self.words[i] = self.words[i] + value

    def beat(self, at_ns: int | None = None) -> None:
        """Stamp the heartbeat now, or at `at_ns` (a worker of lanes: the start of its oldest
        batch still running, so a stuck lane ages it while the others loop)."""
        self.words[L.CTL_HEARTBEAT] = time.monotonic_ns() if at_ns is None else at_ns

    def heartbeat_age_ms(self) -> float | None:
        """Milliseconds since the last beat; None before the worker's first."""
        stamp = self.words[L.CTL_HEARTBEAT]
        return (time.monotonic_ns() - stamp) / 1e6 if stamp else None

    def count_batch(self, size: int) -> None:
        for i, bound in enumerate(L.BATCH_BOUNDS):
            if size <= bound:
                self.words[L.CTL_BATCH_HIST + i] += 1
                return
        self.words[L.CTL_BATCH_HIST + len(L.BATCH_BOUNDS) - 1] += 1

    def batch_histogram(self) -> list[int]:
        return [self.words[L.CTL_BATCH_HIST + i] for i in range(len(L.BATCH_BOUNDS))]

    def set_model_rss(self, index: int, rss_bytes: int) -> None:
        """The bytes model `index` added to this worker's RSS (the worker, once, at load)."""
        self.words[L.CTL_MODEL_RSS + _model_word(index)] = rss_bytes

    def model_rss(self, index: int) -> int:
        """The bytes model `index` added to the worker's RSS; 0 before it loaded, or if the
        worker does not hold it."""
        return self.words[L.CTL_MODEL_RSS + _model_word(index)]

    def snapshot(self) -> dict[str, int]:
        return {name: self.words[i] for name, i in L.CTL.items()}

    def close(self) -> None:
        self.words.release()


def _model_word(index: int) -> int:
    if not 0 <= index < L.MAX_MODELS:
        raise ValueError(f"model index {index} outside 0..{L.MAX_MODELS - 1}")
    return index


def model_rss(ctl: ControlBlock, index: int) -> int:
    """The front-end's reading: the bytes model `index` added to one worker's RSS (0: not
    loaded there, or not yet)."""
    return ctl.model_rss(index)
