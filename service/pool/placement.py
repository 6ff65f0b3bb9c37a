"""Where a worker runs: its device (slot s on GPU s mod G) and the CPUs it is pinned to."""

from __future__ import annotations

import os

from ringserve.workers.runtimes import nvml
from ringserve.workers.spec import FAKE_GPU


def gpu_indices(device: str) -> list[int]:
    """The CUDA device indices a resolved --device names ([0] for the test-only fake GPU)."""
    if device == FAKE_GPU:
        return [0]
    if device == "cuda":
        return list(range(nvml.cuda_device_count()))
    if device.startswith("cuda:"):
        return [int(device.split(":", 1)[1])]
    return []


class Placement:
    def __init__(self, device: str, threads: int) -> None:
        self.device = device
        self.threads = max(1, threads)  # --threads: a CPU worker's share of cores
        self.ncpu = sorted(os.sched_getaffinity(0))
        self.gpus = gpu_indices(device)  # CUDA devices the workers spread over; [] on the CPU
        self.gpu_cpus = {k: nvml.default().local_cpus(k) for k in self.gpus} if self.gpus else {}

    def on_gpu(self) -> bool:
        return bool(self.gpus) or self.device == FAKE_GPU

    def device_for(self, slot: int | None, spare_devices: list[str]) -> str:
        """Slot s runs on GPU s mod G; a new spare on the GPU with the fewest spares; the CPU
        device is as given."""
        if not self.gpus or self.device == FAKE_GPU:
            return self.device
        if slot is None:
            return min((f"cuda:{g}" for g in self.gpus), key=spare_devices.count)
        return f"cuda:{self.gpus[slot % len(self.gpus)]}"

    def near_cpus(self, slot: int) -> list[int]:
        """The CPUs nearest the slot's GPU (NVML or sysfs), or [] when the system does not say."""
        if not self.gpus:
            return []
        near = self.gpu_cpus.get(self.gpus[slot % len(self.gpus)], [])
        return [c for c in near if c in self.ncpu]

    def cpus_for(self, slot: int | None, on_cpu: bool) -> list[int]:
        """A spare may run anywhere until it takes a slot. `on_cpu`: the slot's worker runs on
        the CPU (a CPU server, or a slot whose GPU failed)."""
        if slot is None:
            return list(self.ncpu)
        if self.gpus and not on_cpu:
            # A GPU worker tokenizes, moves rings and launches kernels: it gets every CPU near
            # its GPU (shared with that GPU's other workers), not one core.
            return self.near_cpus(slot) or list(self.ncpu)
        per = self.threads
        near = self.near_cpus(slot)
        if near:  # disjoint sets within the GPU's CPUs, in slot order
            rank = sum(1 for s in range(slot) if self.near_cpus(s) == near)
            return [near[(rank * per + i) % len(near)] for i in range(per)]
        start = (slot * per) % len(self.ncpu)
        return [self.ncpu[(start + i) % len(self.ncpu)] for i in range(per)]
