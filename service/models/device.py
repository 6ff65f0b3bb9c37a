"""Every --device string asked for is read here: `resolve_device` turns it into what serves
(once, at start); which CUDA devices a resolved one spreads over is the pool's
(service/pool/placement.py `gpu_indices`). The worker-side facts (FAKE_GPU, is_gpu_device)
live in workers/spec.py, below the service, and are re-exported here."""

from __future__ import annotations

import os
import re

from ringserve.service.logs import EventLog
from ringserve.workers.runtimes import nvml
from ringserve.workers.spec import FAKE_GPU, is_gpu_device
from ringserve.workers.testhooks import HOOKS

__all__ = ["FAKE_GPU", "is_gpu_device", "resolve_device"]


def resolve_device(wanted: str, log: EventLog) -> str:
    """`auto` means CUDA when NVML and torch both see a GPU; otherwise the CPU, said once.
    `fake-gpu` (tests only, with RINGSERVE_TEST_FAKE_GPU=1) runs the CUDA code path on the CPU."""
    if wanted == "cpu":
        return "cpu"
    if wanted == FAKE_GPU and HOOKS.fake_gpu:
        log.warning("device_fake_gpu", reason="test-only: the GPU code path runs on the CPU")
        return wanted
    if wanted != "auto" and not re.fullmatch(r"cuda(:\d+)?", wanted):
        raise SystemExit(f"ringserve: unknown --device {wanted!r} (cpu, cuda, cuda:K or auto)")
    # NVML numbers GPUs in PCI bus order; so must CUDA, here and in every worker (cuda:K is
    # then the K-th GPU as nvidia-smi lists it, whatever CUDA_DEVICE_ORDER the user set).
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    missing = nvml.cuda_unavailable_reason()
    if wanted == "auto":
        if missing is None:
            return "cuda"
        log.info("device_auto", device="cpu", reason=missing)
        return "cpu"
    if missing is not None:
        raise SystemExit(f"ringserve: --device {wanted} asked for, but {missing}")
    count = nvml.cuda_device_count()
    if ":" in wanted and int(wanted.split(":")[1]) >= count:
        raise SystemExit(f"ringserve: --device {wanted}: only {count} CUDA device(s) here")
    return wanted
