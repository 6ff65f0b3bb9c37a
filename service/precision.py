"""--precision resolved at start: `auto` to the fastest faithful precision of a model, and the
precisions this CPU cannot run refused with the flags it lacks.

`auto` reads only the figures the artifact published from its publication split
(manifest.int8, factory/int8.py `publish`), never ones a recipe was chosen on: int8 when it
agrees with fp32 on at least 99% of the split's decisions and costs at most 0.5 point of
accuracy (an embed-only model: a mean cosine to fp32 of at least 0.999), and ran faster than
fp32 where it was built; fp32 otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MIN_AGREEMENT = 0.99  # int8's decisions equal to fp32's, at least this share of the split
MAX_ACCURACY_COST = 0.005  # accuracy int8 may lose against fp32: half a point
MIN_MEAN_COSINE = 0.999  # an embed-only model: int8's vectors this close to fp32's on average
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # what a CPU needs to run bf16 at speed


def auto_precision(cost: dict[str, Any], has_int8: bool) -> tuple[str, str]:
    """The precision `auto` serves given int8's published cost, and why (one line)."""
    if not has_int8 or not cost:
        return "fp32", "auto: the artifact has no int8 graph"
    where = f"of {cost.get('texts')} texts"
    if "mean_cosine" in cost:
        cosine = cost["mean_cosine"]
        if cosine < MIN_MEAN_COSINE:
            return "fp32", f"auto: int8's mean cosine to fp32 is {cosine} {where}, below 0.999"
        said = f"int8's mean cosine to fp32 is {cosine} {where}"
    else:
        agreement = cost.get("argmax_agreement", 0.0)
        if agreement < MIN_AGREEMENT:
            return "fp32", f"auto: int8 agrees on {agreement} {where}, below {MIN_AGREEMENT}"
        said = f"int8 agrees on {agreement} {where}"
        lost = cost.get("accuracy_cost")
        if lost is not None and lost > MAX_ACCURACY_COST:
            return "fp32", f"auto: int8 costs {lost * 100:.2f} points of accuracy, above 0.5"
        if lost is not None:
            said += f" and costs {lost * 100:.2f} points of accuracy"
    speedup = cost.get("speedup")
    if speedup is not None and speedup <= 1.0:
        return "fp32", f"auto: {said}, but ran at {speedup}x fp32's speed"
    return "int8", f"auto: {said}" + (f", {speedup}x fp32's speed" if speedup else "")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def cpu_refusal(precision: str, flags: set[str]) -> str:
    """Why the CPU cannot serve `precision` ("" when it can)."""
    if precision == "fp16":
        return "--precision fp16 runs on CUDA only"
    if precision != "bf16":
        return ""
    if not flags & set(BF16_FLAGS):
        return (
            f"--precision bf16 needs a CPU with {' or '.join(BF16_FLAGS)}; this one has "
            "neither (use fp32, int8 or auto)"
        )
    return (
        f"--precision bf16 is served on CUDA only so far; this CPU has "
        f"{', '.join(f for f in BF16_FLAGS if f in flags)} (benchmarks/runtimes.py measures "
        "OpenVINO bf16 on it)"
    )
