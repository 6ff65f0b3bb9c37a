"""The CPU's facts, read from /proc/cpuinfo here and nowhere else: its flags (what the
precision check and the artifact build decide bf16 by) and a key for what was timed on it (the
fp32 graph choice, workers/runtimes/graphpick.py). RINGSERVE_CPUINFO names a recorded file read
in place of this machine's."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PROC_CPUINFO = Path("/proc/cpuinfo")
# A recorded /proc/cpuinfo read in place of this machine's: what `auto` and the bf16 refusal
# would decide on that CPU (tests record an AVX2-only EPYC's; an operator can ask the same).
CPUINFO_ENV = "RINGSERVE_CPUINFO"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # what a CPU needs to run bf16 at speed


def cpuinfo_text(cpuinfo: Path | None = None) -> str:
    """`cpuinfo`'s text, else RINGSERVE_CPUINFO's file's, else /proc/cpuinfo's; "" unreadable."""
    if cpuinfo is None:
        cpuinfo = Path(os.environ.get(CPUINFO_ENV) or PROC_CPUINFO)
    try:
        return cpuinfo.read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: Path | None = None) -> set[str]:
    """The CPU's flags: the first `flags` line of cpuinfo_text()."""
    for line in cpuinfo_text(cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def speed_key() -> str:
    """The CPU as far as speed goes: a digest of its model name and flags ("unknown" when there
    is no cpuinfo). Timings are what this machine measured, so it reads this machine's file."""
    info = cpuinfo_text(PROC_CPUINFO)
    if not info:
        return "unknown"
    lines = [x for x in info.splitlines() if x.startswith(("model name", "flags"))]
    return hashlib.sha256("\n".join(sorted(set(lines))).encode()).hexdigest()[:12]
