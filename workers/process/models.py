"""The model set: every model a worker serves, loaded at boot (workers/process/served.py's
Loader, taking what the zygote preloaded), and the turns among them (Turns) that say whose
batch runs next. A request names its model by index (shm.layout.split_meta)."""

from __future__ import annotations

import time
from typing import Any

from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock
from ringserve.workers.batches import Item
from ringserve.workers.process.served import Loader, Preloaded, Served, Turns
from ringserve.workers.spec import WorkerSpec, is_gpu_device


class ModelSet:
    """The worker's models by wire index, their turns, and on a GPU the NVML monitor."""

    def __init__(self, spec: WorkerSpec, ctl: ControlBlock, max_payload: int) -> None:
        self.spec = spec
        self.ctl = ctl
        self.loader = Loader(spec, ctl, max_payload)
        self.served: dict[int, Served] = {}  # model index (the wire's) -> its state
        self.turns = Turns({})
        self.gpu: Any = None  # workers.runtimes.nvml.GpuMonitor on CUDA: sampled from the loop

    @property
    def model_ok(self) -> bool:
        """The model being loaded is fine: a boot failure now is the device's."""
        return self.loader.model_ok

    def load(self, preloaded: dict[str, Preloaded] | None = None) -> None:
        """Load every model of the spec (taking what the zygote preloaded, keyed by model
        directory), warm each one's shapes, and say how long it took."""
        t0 = time.monotonic()
        for ref in self.spec.refs():
            served = self.loader.load(ref, (preloaded or {}).get(ref.model_dir))
            self.served[ref.index] = served
            self.ctl.set_model_rss(ref.index, served.rss_bytes)
            self.ctl.beat()
        # Whole batches behind a lighter model's on the CPU; a GPU keeps the capped ones.
        behind = len(self.served) > 1 and not is_gpu_device(self.spec.device)
        if self.spec.lanes > 1 and len(self.served) != 1:  # settings.resolve_lanes keeps this out
            raise ValueError("a worker of several lanes serves one model")
        self.turns = Turns({i: m.batcher for i, m in self.served.items()}, behind)
        for started, warm_s in self.loader.started:  # GPU: report the graphs; sample NVML
            monitor = started(warm_s)
            self.gpu = self.gpu if self.gpu is not None else monitor
        self.ctl.set("boot_ms", int((time.monotonic() - t0) * 1000))

    def expire(self, now_ns: int) -> list[Item]:
        """Take out every text, of any model, whose deadline passed before it ran."""
        late: list[Item] = []
        for served in self.served.values():
            late.extend(served.batcher.expire(now_ns))
        return late

    def tick(self) -> None:
        """Sample the GPU (at most once a second; never raises)."""
        if self.gpu is not None:
            self.gpu.tick()

    def ready(self) -> None:
        self.ctl.set("state", L.W_READY)
