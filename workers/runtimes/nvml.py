"""Reads one GPU's memory, utilisation, temperature and power through NVML, never raising.

Every NVML call is wrapped: a machine without a driver, a lost GPU or a missing library gives no
reading (None, or an empty list), never an exception, so a worker and the front-end run on.
The library is `pynvml` from the nvidia-ml-py package; tests pass a stand-in as `lib`.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLE_PERIOD_S = 1.0  # NVML queries cost up to ~1 ms (power); once a second is plenty
_SYSFS_PCI = Path("/sys/bus/pci/devices")


@dataclass(frozen=True)
class GpuSample:
    mem_used: int  # bytes, the whole device (every process)
    mem_total: int
    util_milli: int  # busy fraction x 1000 over NVML's last sample window
    temp_c: int
    power_mw: int


class Nvml:
    """One process's NVML session: initialised on first use; a failure is remembered, not
    retried on every call (a missing driver does not come back)."""

    def __init__(self, lib: Any = None) -> None:
        self._lib = lib
        self._state: bool | None = None  # None: not tried; False: unavailable
        self.error = ""

    def lib(self) -> Any:
        """The initialised pynvml module, or None when NVML is unusable here."""
        if self._state is None:
            self._state = self._init()
        return self._lib if self._state else None

    def _init(self) -> bool:
        try:
            if self._lib is None:
                import pynvml

                self._lib = pynvml
            self._lib.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError, ImportError, OSError: all mean "none"
            self.error = f"{type(exc).__name__}: {exc}"
            return False
        return True

    def call(self, name: str, *args: Any) -> Any:
        """lib.<name>(*args), or None on any error (a lost GPU, an unsupported query)."""
        lib = self.lib()
        if lib is None:
            return None
        try:
            return getattr(lib, name)(*args)
        except Exception:  # noqa: BLE001 - NVML errors must never reach the serving loop
            return None

    def device_count(self) -> int:
        n = self.call("nvmlDeviceGetCount")
        return int(n) if isinstance(n, int) else 0

    def handle(self, cuda_index: int) -> Any:
        """The NVML handle of CUDA device `cuda_index`, honouring CUDA_VISIBLE_DEVICES."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return self.call("nvmlDeviceGetHandleByIndex", cuda_index)
        names = [v.strip() for v in visible.split(",") if v.strip()]
        if not 0 <= cuda_index < len(names):
            return None
        name = names[cuda_index]
        if name.isdigit():
            return self.call("nvmlDeviceGetHandleByIndex", int(name))
        return self.call("nvmlDeviceGetHandleByUUID", name)  # GPU-... or MIG-... names

    def handle_by_uuid(self, uuid: str) -> Any:
        """The handle of the device torch calls `uuid` (torch omits NVML's GPU-/MIG- prefix)."""
        names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
        for name in names:
            handle = self.call("nvmlDeviceGetHandleByUUID", name)
            if handle is not None:
                return handle
        return None

    def sample(self, handle: Any) -> GpuSample | None:
        """Memory, utilisation, temperature and power of one device; None if memory fails."""
        if handle is None:
            return None
        mem = self.call("nvmlDeviceGetMemoryInfo", handle)
        if mem is None:
            return None
        util = self.call("nvmlDeviceGetUtilizationRates", handle)
        temp = self.call("nvmlDeviceGetTemperature", handle, 0)  # NVML_TEMPERATURE_GPU
        power = self.call("nvmlDeviceGetPowerUsage", handle)  # milliwatts
        return GpuSample(
            mem_used=int(mem.used),
            mem_total=int(mem.total),
            util_milli=int(util.gpu) * 10 if util is not None else -1,
            temp_c=int(temp) if temp is not None else -1,
            power_mw=int(power) if power is not None else -1,
        )

    def local_cpus(self, cuda_index: int) -> list[int]:
        """CPUs nearest the GPU (its NUMA node), from NVML, else sysfs; [] when unknown."""
        handle = self.handle(cuda_index)
        if handle is None:
            return []
        words = self.call("nvmlDeviceGetCpuAffinity", handle, -(-(os.cpu_count() or 1) // 64))
        if words is not None:
            cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]
            if cpus:
                return cpus
        pci = self.call("nvmlDeviceGetPciInfo", handle)
        bus = getattr(pci, "busId", b"") if pci is not None else b""
        return sysfs_local_cpus(bus.decode() if isinstance(bus, bytes) else str(bus))


def sysfs_local_cpus(bus_id: str) -> list[int]:
    """`local_cpulist` of a PCI device; NVML's bus id 00000000:3B:00.0 is 0000:3b:00.0 here."""
    if not bus_id or ":" not in bus_id:
        return []
    domain, rest = bus_id.split(":", 1)
    path = _SYSFS_PCI / f"{domain[-4:]}:{rest}".lower() / "local_cpulist"
    try:
        return parse_cpulist(path.read_text())
    except (OSError, ValueError):
        return []


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


_default: Nvml | None = None


def default() -> Nvml:
    """The process's shared NVML session."""
    global _default
    if _default is None:
        _default = Nvml()
    return _default


def driver_present() -> bool:
    """An NVIDIA kernel driver is loaded (its control device exists), NVML or not: a container
    given only the `compute` capability has CUDA without libnvidia-ml."""
    return Path("/dev/nvidiactl").exists()


def cuda_unavailable_reason(nvml: Nvml | None = None) -> str | None:
    """None when CUDA can serve here; else why not. Without a driver the answer comes in
    milliseconds and the front-end never imports torch to learn it; NVML only feeds the
    readings, so a driver without NVML still asks torch."""
    nvml = nvml or default()
    if nvml.lib() is None and not driver_present():
        return f"no NVIDIA driver (NVML: {nvml.error or 'not available'})"
    if nvml.lib() is not None and nvml.device_count() == 0:
        return "NVML sees no GPU"
    try:
        import torch

        if not torch.cuda.is_available():
            return f"torch {torch.__version__} cannot use CUDA here"
        if torch.cuda.device_count() == 0:
            return "torch sees no CUDA device"
    except Exception as exc:  # noqa: BLE001 - a broken CUDA install means no CUDA
        return f"torch cannot use CUDA: {exc}"
    return None


def cuda_device_count() -> int:
    """CUDA devices visible to this process (0 without CUDA)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return 0


class GpuMonitor:
    """Writes one GPU's NVML readings and the caching allocator's reserved and allocated bytes
    into a worker's control block, at most once per `period_s` (called from the serving loop)."""

    def __init__(
        self,
        ctl: Any,
        cuda_index: int,
        torch_device: Any = None,
        nvml: Nvml | None = None,
        period_s: float = SAMPLE_PERIOD_S,
    ) -> None:
        self.ctl = ctl
        self.nvml = nvml or default()
        self.handle = self._handle(cuda_index, torch_device)
        self.torch_device = torch_device  # None: no allocator figures (a faked GPU)
        self.period_s = period_s
        self.last = 0.0
        ctl.set("gpu_index", cuda_index)

    def _handle(self, cuda_index: int, torch_device: Any) -> Any:
        """By the UUID torch reports for the device when it can say (CUDA and NVML may number
        GPUs differently), else by index."""
        if torch_device is not None:
            with contextlib.suppress(Exception):
                import torch

                uuid = str(torch.cuda.get_device_properties(torch_device).uuid)
                handle = self.nvml.handle_by_uuid(uuid)
                if handle is not None:
                    return handle
        return self.nvml.handle(cuda_index)

    def tick(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if now - self.last < self.period_s:
            return False
        self.last = now
        self.sample()
        return True

    def sample(self) -> GpuSample | None:
        reading = self.nvml.sample(self.handle)
        ctl = self.ctl
        if reading is not None:
            ctl.set("gpu_mem_used", reading.mem_used)
            ctl.set("gpu_mem_total", reading.mem_total)
            ctl.set("gpu_util_milli", reading.util_milli)
            ctl.set("gpu_temp_c", reading.temp_c)
            ctl.set("gpu_power_mw", reading.power_mw)
        if self.torch_device is not None:
            with contextlib.suppress(Exception):  # an allocator query must not stop serving
                import torch

                # reserved - allocated is not waste under CUDA graphs: it includes the graph
                # pool's working memory, which every replay uses.
                ctl.set("cuda_reserved", int(torch.cuda.memory_reserved(self.torch_device)))
                ctl.set("cuda_allocated", int(torch.cuda.memory_allocated(self.torch_device)))
        return reading
