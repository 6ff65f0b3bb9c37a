"""The small picklable description of one worker process, built by the front-end."""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from typing import Any

from ringserve.shm.channel import ChannelNames

# Exit codes with a meaning for the supervisor (STYLE.md lesson 3).
EXIT_OK = 0
EXIT_BOOT_ERROR = 3  # the model cannot be loaded: stop the server, do not crash-loop
EXIT_PARENT_GONE = 4
# The device failed while the worker booted (a CUDA init or GPU load error, out of memory, a
# busy GPU): retried with a backoff, then the slot serves from the CPU; never a server stop,
# since the model itself loaded fine.
EXIT_DEVICE_ERROR = 5

# Workers and the zygote ignore SIGTERM, SIGINT and SIGHUP: those reach them as signals to the
# whole process group or cgroup (`kill -TERM -PGID`, systemd's KillMode=control-group, tini -g,
# Ctrl-C), and the front-end alone decides what a stop means. It stops a worker with this one.
GROUP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_SIGNAL = signal.SIGUSR1


def ignore_group_signals() -> None:
    for sig in GROUP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


# Test-only device: the CUDA code path (static shapes, OOM fallback) run on the CPU, for machines
# without a GPU; accepted only with RINGSERVE_TEST_FAKE_GPU=1 in the environment.
FAKE_GPU = "fake-gpu"


def is_gpu_device(device: str) -> bool:
    """The CUDA code path runs for this device (a GPU, or the test-only fake one)."""
    return device.startswith("cuda") or device == FAKE_GPU


@dataclass(frozen=True)
class ModelRef:
    """One model a worker loads: its index on the wire (shm.layout.request_meta), its name and
    version as clients name it, and where its artifact lies."""

    index: int
    name: str
    version: int
    model_dir: str
    # Per-model settings over the worker's own (WorkerSpec fields: runtime, precision,
    # long_text, max_batch, max_length), from a config file's [models.NAME] table.
    options: tuple[tuple[str, Any], ...] = ()


@dataclass
class WorkerSpec:
    serial: int  # unique per process the server starts; names its segments
    parent_pid: int
    cpus: list[int]
    threads: int
    device: str  # "cpu" or "cuda:K"
    model_dir: str
    channel: ChannelNames  # segment names
    buckets: tuple[int, ...]  # --buckets as given; empty = the device's default
    max_batch: int
    max_delay_ms: float
    doorbell: Any  # shm.doorbell.Semaphore: posted once per request (None while in transit)
    eventfd: Any  # shm.doorbell.EventFd: written once per batch of answers (as above)
    precision: str = "fp32"  # CUDA: fp32, fp16 or bf16 (autocast); CPU: fp32 or int8
    max_batch_tokens: int = 512  # CPU batches: most padded tokens (rows x padded length)
    runtime: str = "auto"  # CPU: torch, onnx or auto (workers.runtimes.onnx_model.choose_runtime)
    graph: str = "plain"  # ONNX Runtime fp32: plain or fused (the front-end resolves auto)
    long_text: str = "truncate"  # --long-text: truncate, refuse or window (process.longtext)
    window_stride: int = 32  # --window-stride
    max_windows: int = 16  # --max-windows
    bulk_max_wait_ms: float = 2000.0  # --bulk-max-wait-ms: a bulk text's wait behind others
    # A config file table's max_length, below the artifact's (0: the artifact's own); the
    # worker serves the manifest as workers.artifact.as_served gives it, as the front-end does.
    max_length: int = 0
    # Every model this worker serves; empty: the one model at model_dir, index 0.
    models: tuple[ModelRef, ...] = ()
    # Batches run at once, each by a thread pinned to its own `threads` of `cpus` with its own
    # runner, from one Batcher (workers/process/worker.py Lanes); 1: the serving loop alone.
    lanes: int = 1
    # A batch the other lanes leave alone runs on every lane's cores (cpu.OrtRunner.duo).
    lone_cores: bool = False

    def for_model(self, ref: ModelRef) -> WorkerSpec:
        """This spec as one model is served: its per-model settings over the worker's."""
        return dataclasses.replace(self, **dict(ref.options)) if ref.options else self

    def refs(self) -> tuple[ModelRef, ...]:
        """The models to load: `models`, or the one at `model_dir` as index 0."""
        return self.models or (ModelRef(0, "", 0, self.model_dir),)
