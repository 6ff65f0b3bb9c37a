"""What the metrics tests share: a long text, and the GPU families /metrics writes for
workers over real control-block segments (no GPU needed: the blocks are filled as a worker
fills them)."""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace
from typing import Any

from ringserve.service.ops import prometheus as P
from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock
from ringserve.shm.segment import Segment

LONG_TEXT = " ".join(["an unexpectedly long review that keeps on going"] * 20)  # > 128 tokens


class FakeWorker:
    """A worker as the metrics see it, over a real control block segment."""

    def __init__(self, serial: int, slot: int | None) -> None:
        name = f"rs_test_{os.getpid()}_{serial}_{uuid.uuid4().hex[:6]}"
        self.segment = Segment.create(name, L.CONTROL_BYTES)
        self.ctl = ControlBlock(self.segment, create=True)
        self.serial = serial
        self.slot = slot
        self.pid = 4000 + serial
        self.dead = False

    def close(self) -> None:
        self.ctl.close()
        self.segment.close()
        self.segment.unlink()


def fake_gpu_exposition(power_mw: int = 210_000) -> str:
    """What /metrics adds for two CUDA workers on GPU 1 (control blocks as a worker fills them;
    a reading NVML cannot give is -1)."""
    workers = [FakeWorker(1, 0), FakeWorker(2, None)]
    try:
        for w in workers:
            for name, v in (
                ("device_kind", 1),
                ("gpu_index", 1),
                ("gpu_mem_used", 3 << 30),
                ("gpu_mem_total", 80 << 30),
                ("gpu_util_milli", 625),
                ("gpu_temp_c", 55),
                ("gpu_power_mw", power_mw),
                ("cuda_reserved", 1 << 30),
                ("cuda_allocated", 1 << 29),
            ):
                w.ctl.set(name, v)
        pool: Any = SimpleNamespace(all={1: workers[0], 2: workers[1]})
        out = P.Exposition()
        P.gpus(out, pool)
        return out.text().decode()
    finally:
        for w in workers:
            w.close()
