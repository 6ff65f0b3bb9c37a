"""Every test-only hook of the server, in one place, read once from the environment at import.

All are off unless a test sets its RINGSERVE_TEST_* variable. Worker processes inherit the
front-end's environment, so both sides read the same values and nothing passes them along (no
field in the worker spec, none in the shared-memory layout).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Hooks:
    # RINGSERVE_TEST_FAKE_GPU=1: accept `--device fake-gpu`, the CUDA code path run on the CPU.
    fake_gpu: bool = False
    # RINGSERVE_TEST_GROW_BYTES_PER_BATCH=N: a worker keeps N more bytes after each batch, a leak
    # for the supervisor's RSS limit to catch.
    grow_bytes_per_batch: int = 0
    # RINGSERVE_TEST_INJECT_OOM=N: each GPU worker's first N GPU forwards raise CUDA out-of-memory.
    inject_oom_batches: int = 0
    # RINGSERVE_TEST_DEVICE_BOOT_ERRORS=N: the first N workers the server starts (serials 1..N)
    # fail at boot with the DeviceError a busy or full GPU gives.
    device_boot_errors: int = 0
    # RINGSERVE_TEST_CAPTURE_ERROR=1: every CUDA-graph capture raises, as a real one can.
    capture_error: bool = False
    # RINGSERVE_TEST_BATCH_DELAY_MS=N: a worker sleeps N ms before each batch, so a test can hold
    # it between two batches of one windowed text (a kill then lands with some windows done).
    batch_delay_ms: int = 0
    # RINGSERVE_TEST_PREDICTABLE_SEGMENTS=1: the first name tried for each segment is the
    # predictable rs_<pid>_<serial>_<kind> (shm/segment.py), so a test can take it first.
    predictable_segments: bool = False
    # RINGSERVE_TEST_LYING_WORKER=KIND[:N]: worker serial 1 writes one malformed answer (KIND:
    # workers/process/lies.py) in place of its (N+1)th answer (N: 0), as a compromised or
    # broken worker could; nothing outside a worker can make one.
    lying_worker: str = ""


def read(env: Mapping[str, str]) -> Hooks:
    return Hooks(
        fake_gpu=env.get("RINGSERVE_TEST_FAKE_GPU") == "1",
        grow_bytes_per_batch=int(env.get("RINGSERVE_TEST_GROW_BYTES_PER_BATCH") or 0),
        inject_oom_batches=int(env.get("RINGSERVE_TEST_INJECT_OOM") or 0),
        device_boot_errors=int(env.get("RINGSERVE_TEST_DEVICE_BOOT_ERRORS") or 0),
        capture_error=env.get("RINGSERVE_TEST_CAPTURE_ERROR") == "1",
        batch_delay_ms=int(env.get("RINGSERVE_TEST_BATCH_DELAY_MS") or 0),
        predictable_segments=env.get("RINGSERVE_TEST_PREDICTABLE_SEGMENTS") == "1",
        lying_worker=env.get("RINGSERVE_TEST_LYING_WORKER") or "",
    )


HOOKS = read(os.environ)
