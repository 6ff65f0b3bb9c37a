"""--precision resolved at start: `auto` to the fastest faithful precision of a model, and the
precisions this CPU cannot run refused with the flags it lacks.

`auto` reads only the figures the artifact published from its publication split
(manifest.int8, int8_checked and bf16: factory/int8.py `publish`, `publish_checked` and
`publish_bf16`), never ones a recipe or a threshold was chosen on. A candidate is faithful when
it agrees with fp32 on at least 99% of the split's decisions and costs at most 0.5 point of
accuracy (an embed-only model: a mean cosine to fp32 of at least 0.999), and ran faster than
fp32 where it was built. The candidates are int8 (when the artifact has its graph),
int8-checked (when it also published a second look) and bf16 (when this CPU has AVX512_BF16 or
AMX and the artifact published bf16's cost); the fastest faithful one by its published speedup
serves, fp32 when none is.
"""

from __future__ import annotations

from typing import Any

from ringserve.workers.cpu import BF16_FLAGS

MIN_AGREEMENT = 0.99  # a precision's decisions equal to fp32's, at least this share of the split
MAX_ACCURACY_COST = 0.005  # accuracy a precision may lose against fp32: half a point
MIN_MEAN_COSINE = 0.999  # an embed-only model: its vectors this close to fp32's on average
# a sparse model (factory/sparse_cost.py): its queries' top 10 documents by dot product, this
# share of them the same as fp32's on average
MIN_RANK_OVERLAP = 0.99


def judge(name: str, cost: dict[str, Any]) -> tuple[bool, str]:
    """Whether `name` (int8 or bf16) is faithful and faster by its published `cost`, and what
    says so or why not (a clause of the reason line)."""
    where = f"of {cost.get('texts')} texts"
    if "rank_overlap_at_10" in cost:  # a sparse model: how its dot products rank documents
        overlap = cost["rank_overlap_at_10"]
        said = f"{name} keeps {overlap} of fp32's top 10 documents a query {where}"
        if overlap < MIN_RANK_OVERLAP:
            return False, f"{said}, below {MIN_RANK_OVERLAP}"
    elif "mean_cosine" in cost:
        cosine = cost["mean_cosine"]
        if cosine < MIN_MEAN_COSINE:
            return False, f"{name}'s mean cosine to fp32 is {cosine} {where}, below 0.999"
        said = f"{name}'s mean cosine to fp32 is {cosine} {where}"
    else:
        agreement = cost.get("argmax_agreement", 0.0)
        if agreement < MIN_AGREEMENT:
            return False, f"{name} agrees on {agreement} {where}, below {MIN_AGREEMENT}"
        said = f"{name} agrees on {agreement} {where}"
        lost = cost.get("accuracy_cost")
        if lost is not None and lost > MAX_ACCURACY_COST:
            return False, f"{name} costs {lost * 100:.2f} points of accuracy, above 0.5"
        if lost is not None:
            said += f" and costs {lost * 100:.2f} points of accuracy"
    speedup = cost.get("speedup")
    if speedup is not None and speedup <= 1.0:
        return False, f"{said}, but ran at {speedup}x fp32's speed"
    return True, said + (f", {speedup}x fp32's speed" if speedup else "")


def auto_precision(
    cost: dict[str, Any],
    has_int8: bool,
    bf16: dict[str, Any] | None = None,
    cpu_bf16: bool = False,
    checked: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """The precision `auto` serves given int8's, int8-checked's and bf16's published costs, and
    why (one line): the faithful candidate with the highest published speedup (int8 on a tie),
    else fp32."""
    judged: list[tuple[str, bool, str, float]] = []
    if has_int8 and cost:
        judged.append(("int8", *judge("int8", cost), float(cost.get("speedup") or 1.0)))
    if has_int8 and checked:
        speed = float(checked.get("speedup") or 1.0)
        judged.append(("int8-checked", *judge("int8-checked", checked), speed))
    if cpu_bf16 and bf16:
        judged.append(("bf16", *judge("bf16", bf16), float(bf16.get("speedup") or 1.0)))
    if not judged:
        return "fp32", "auto: the artifact has no int8 graph" + (
            " and publishes no bf16 cost" if cpu_bf16 else ""
        )
    faithful = [j for j in judged if j[1]]
    if not faithful:
        return "fp32", "auto: " + "; ".join(j[2] for j in judged)
    best = max(faithful, key=lambda j: j[3])  # max keeps the first of equals: int8
    others = [j[2] for j in judged if j is not best]
    return best[0], "auto: " + "; ".join([best[2], *others])


def cpu_refusal(precision: str, flags: set[str]) -> str:
    """Why the CPU cannot serve `precision` ("" when it can): bf16 needs one of BF16_FLAGS."""
    if precision == "fp16":
        return "--precision fp16 runs on CUDA only"
    if precision != "bf16":
        return ""
    if not flags & set(BF16_FLAGS):
        return (
            f"--precision bf16 needs a CPU with {' or '.join(BF16_FLAGS)}; this one has "
            "neither (use fp32, int8 or auto)"
        )
    return ""  # served on OpenVINO (workers/runtimes/openvino.py)
