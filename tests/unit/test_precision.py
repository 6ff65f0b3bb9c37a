"""--precision auto's rule over int8's and bf16's published costs, and the CPU precisions
refused by flag."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ringserve.service.config.settings import parse_precision
from ringserve.service.models.precision import auto_precision, cpu_refusal
from ringserve.workers.cpu import CPUINFO_ENV, cpu_flags, speed_key
from ringserve.workers.runtimes.checked import margins

# the default model's published cost on the day the rule was written (manifest.int8)
PUBLISHED = {
    "texts": 3793,
    "argmax_agreement": 0.9794,
    "accuracy_cost": 0.0042,
    "speedup": 1.31,
    "recipe": "dynamic, fp32 ffn_out",
}


def test_int8_below_99_percent_agreement_is_not_chosen() -> None:
    assert auto_precision(PUBLISHED, True) == (
        "fp32",
        "auto: int8 agrees on 0.9794 of 3793 texts, below 0.99",
    )


def test_int8_faithful_and_faster_is_chosen() -> None:
    cost = PUBLISHED | {"argmax_agreement": 0.995, "accuracy_cost": 0.005}
    precision, why = auto_precision(cost, True)
    assert precision == "int8"
    said = "int8 agrees on 0.995 of 3793 texts and costs 0.50 points of accuracy"
    assert why == f"auto: {said}, 1.31x fp32's speed"


def test_each_bound_alone_refuses_int8() -> None:
    good = PUBLISHED | {"argmax_agreement": 0.995, "accuracy_cost": 0.001}
    assert auto_precision(good | {"accuracy_cost": 0.0051}, True)[0] == "fp32"
    assert auto_precision(good | {"argmax_agreement": 0.9899}, True)[0] == "fp32"
    assert auto_precision(good | {"speedup": 1.0}, True)[0] == "fp32"
    assert auto_precision(good, False) == ("fp32", "auto: the artifact has no int8 graph")
    assert auto_precision({}, True)[0] == "fp32"


def test_embed_only_models_go_by_mean_cosine() -> None:
    cost = {"texts": 3793, "min_cosine": 0.98, "mean_cosine": 0.9991}
    assert auto_precision(cost, True)[0] == "int8"
    assert auto_precision(cost | {"mean_cosine": 0.9989}, True) == (
        "fp32",
        "auto: int8's mean cosine to fp32 is 0.9989 of 3793 texts, below 0.999",
    )


def test_auto_is_a_precision_and_bf16_is_refused_by_flag(tmp_path: Path) -> None:
    assert parse_precision(" AUTO ") == "auto"
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    flags = cpu_flags(info)
    assert "avx2" in flags
    said = cpu_refusal("bf16", flags)
    assert "avx512_bf16 or amx_bf16" in said and "neither" in said
    # with either flag, bf16 is served (on OpenVINO)
    assert cpu_refusal("bf16", flags | {"amx_bf16"}) == ""
    assert cpu_refusal("bf16", flags | {"avx512_bf16"}) == ""
    assert cpu_refusal("fp16", flags) == "--precision fp16 runs on CUDA only"
    assert cpu_refusal("int8", flags) == cpu_refusal("fp32", flags) == ""


# the default model's bf16 as benchmarks.runtimes measured it on the AMX Xeon (2026-12-06)
BF16 = {"texts": 3793, "argmax_agreement": 0.9997, "accuracy_cost": -0.0003, "speedup": 2.8}


def test_bf16_faithful_and_fastest_is_chosen_on_a_cpu_with_bf16() -> None:
    precision, why = auto_precision(PUBLISHED, True, BF16, cpu_bf16=True)
    assert precision == "bf16"
    assert why == (
        "auto: bf16 agrees on 0.9997 of 3793 texts and costs -0.03 points of accuracy, 2.8x "
        "fp32's speed; int8 agrees on 0.9794 of 3793 texts, below 0.99"
    )
    # the same artifact on a CPU without bf16: int8's rule alone, as before
    assert auto_precision(PUBLISHED, True, BF16, cpu_bf16=False) == auto_precision(PUBLISHED, True)


def test_the_faster_of_two_faithful_precisions_wins() -> None:
    good8 = PUBLISHED | {"argmax_agreement": 0.995, "accuracy_cost": 0.001}
    assert auto_precision(good8, True, BF16, True)[0] == "bf16"  # 2.8x over 1.31x
    assert auto_precision(good8 | {"speedup": 3.0}, True, BF16, True)[0] == "int8"
    assert auto_precision(good8 | {"speedup": 2.8}, True, BF16, True)[0] == "int8"  # a tie
    assert auto_precision({}, False, BF16, True)[0] == "bf16"  # no int8 graph at all


def test_each_bound_alone_refuses_bf16() -> None:
    for worse in ({"accuracy_cost": 0.0051}, {"argmax_agreement": 0.9899}, {"speedup": 1.0}):
        precision, why = auto_precision({}, False, BF16 | worse, True)
        assert precision == "fp32" and why.startswith("auto: bf16 "), why
    assert auto_precision({}, False, {}, True) == (
        "fp32",
        "auto: the artifact has no int8 graph and publishes no bf16 cost",
    )
    cosine = {"texts": 3793, "min_cosine": 0.99, "mean_cosine": 0.9999, "speedup": 2.5}
    assert auto_precision({}, False, cosine, True)[0] == "bf16"
    assert auto_precision({}, False, cosine | {"mean_cosine": 0.998}, True)[0] == "fp32"


def test_the_start_line_says_bf16s_published_cost() -> None:
    from ringserve.service.models.info import bf16_note

    assert bf16_note("fp32", BF16) == ""  # --runtime openvino at fp32: no cost to state
    assert bf16_note("bf16", BF16) == (
        ": accuracy cost -0.0003, same decision as fp32 on 0.9997 of 3793 texts of the "
        "publication split, 2.8x fp32's speed where built"
    )
    assert "publishes no bf16 cost" in bf16_note("bf16", {})
    cosine = bf16_note("bf16", {"texts": 400, "mean_cosine": 0.9999})
    assert cosine == ": mean cosine to fp32 0.9999 on 400 texts of the publication split"


# int8-checked's cost as the default artifact published it here (2-vCPU EPYC with AVX-512 and
# BF16, 2026-12-07): threshold 0.14 chosen on the selection split
CHECKED = {
    "texts": 3793,
    "argmax_agreement": 0.9979,
    "accuracy_cost": 0.0011,
    "speedup": 1.341,
    "threshold": 0.14,
    "rerun_share": 0.0841,
}


def test_int8_checked_is_chosen_where_int8_is_not_faithful_and_bf16_is_absent() -> None:
    precision, why = auto_precision(PUBLISHED, True, {}, False, CHECKED)
    assert precision == "int8-checked"
    assert why.startswith("auto: int8-checked agrees on 0.9979 of 3793 texts and costs 0.11 ")
    assert why.endswith("; int8 agrees on 0.9794 of 3793 texts, below 0.99")
    # bf16, faithful and faster, wins on a CPU that has it; int8-checked needs the int8 graph
    assert auto_precision(PUBLISHED, True, BF16, True, CHECKED)[0] == "bf16"
    assert auto_precision(PUBLISHED, False, {}, False, CHECKED)[0] == "fp32"
    # its own bounds: agreement, accuracy and speed, as every candidate's
    for worse in ({"argmax_agreement": 0.989}, {"accuracy_cost": 0.006}, {"speedup": 0.95}):
        assert auto_precision(PUBLISHED, True, {}, False, CHECKED | worse)[0] == "fp32"


def test_a_recorded_cpuinfo_stands_in_for_this_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = speed_key()
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    monkeypatch.setenv(CPUINFO_ENV, str(info))
    assert cpu_flags() == {"fpu", "sse2", "avx2", "fma"}
    assert "neither" in cpu_refusal("bf16", cpu_flags())
    # what was timed was timed on this machine: its key does not follow the recorded file
    assert speed_key() == here and len(here) == 12
    assert cpu_flags(tmp_path / "gone") == set()  # an unreadable file reads as no flags


def test_margins_are_a_decisions_distance_from_changing() -> None:
    soft = np.array([[0.9, 0.1], [0.52, 0.48], [0.2, 0.5, 0.3]], dtype=object)
    got = [float(margins(np.array([row]), "softmax")[0]) for row in soft]
    assert np.allclose(got, [0.8, 0.04, 0.2])
    sig = np.array([[0.95, 0.2], [0.55, 0.99]])
    assert np.allclose(margins(sig, "sigmoid"), [0.6, 0.1])  # the closest label decides


def test_the_threshold_covers_every_selection_disagreement() -> None:
    from ringserve.factory.int8 import second_look

    fp32 = np.array([[2.0, 0.0], [0.0, 2.0], [0.1, 0.0], [0.0, 0.3], [3.0, 0.0]])
    int8 = np.array([[1.9, 0.0], [0.0, 2.1], [0.0, 0.1], [0.2, 0.0], [2.9, 0.0]])
    chosen = second_look(fp32, int8, "softmax")
    # rows 2 and 3 changed decision; the wider of their int8 margins is tanh(0.1) = 0.0997
    assert chosen["disagreements"] == 2 and chosen["threshold"] == 0.1
    assert chosen["rerun_share"] == 0.4
    assert second_look(fp32, fp32, "softmax")["threshold"] == 0.0  # nothing to look at again


def test_int8_checked_runs_the_recipe_whose_second_look_is_fastest() -> None:
    """A recipe int8 alone would not ship (fast, less faithful) serves under a second look when
    its int8 pass and its share of fp32 re-runs promise more speed than a faithful recipe's."""
    from pathlib import Path

    from ringserve.factory.int8 import Candidate, checked_estimate, checked_pick

    fp32 = np.array([[2.0, 0.0], [0.0, 2.0], [0.1, 0.0], [0.0, 0.3], [3.0, 0.0]])
    loose = np.array([[1.9, 0.0], [0.0, 2.1], [0.0, 0.1], [0.2, 0.0], [2.9, 0.0]])
    fast = Candidate("dynamic", Path("a"), {"texts_per_s": 800.0, "speedup": 2.5}, loose)
    slow = Candidate("faithful", Path("b"), {"texts_per_s": 416.0, "speedup": 1.3}, fp32)
    for c in (fast, slow):
        c.row["checked"] = checked_estimate(fp32, c.logits, "softmax", c.row, 320.0)
    # fast: 2 of 5 re-run at threshold 0.1: 1 / (1/800 + 0.4/320) = 400 texts/s, 1.25x of 320
    assert fast.row["checked"] == {
        "threshold": 0.1, "rerun_share": 0.4, "disagreements": 2, "speedup_estimate": 1.25
    }  # fmt: skip
    assert slow.row["checked"]["rerun_share"] == 0.0  # nothing changed: nothing to look at
    assert checked_pick([fast, slow]) is slow  # 1.3x, re-running nothing, against 1.25x
    fast.row |= {"texts_per_s": 1600.0, "speedup": 5.0}  # 1 / (1/1600 + 0.4/320): 1.67x
    fast.row["checked"] = checked_estimate(fp32, fast.logits, "softmax", fast.row, 320.0)
    assert checked_pick([slow, fast]) is fast


def test_close_calls_run_through_fp32_at_their_own_length() -> None:
    from ringserve.workers.runtimes.checked import close_feed

    ids = np.array([[5, 6, 7, 8], [5, 6, 0, 0], [5, 0, 0, 0]])
    mask = (ids != 0).astype(np.int64)
    rows, feed = close_feed(ids, mask, np.array([False, True, True]))
    assert rows.tolist() == [1, 2]
    assert feed["input_ids"].tolist() == [[5, 6], [5, 0]]
    assert feed["attention_mask"].tolist() == [[1, 1], [1, 0]]


def test_int8_checked_runs_its_own_graph_where_the_artifact_has_one() -> None:
    from ringserve.workers.artifact import Manifest

    old = Manifest("m", ["a", "b"], 128, "", onnx_file="model.onnx", int8_file="model.int8.onnx")
    assert old.onnx_for("int8-checked") == "model.int8.onnx"  # format 8: int8's own graph
    new = Manifest("m", ["a", "b"], 128, "", onnx_file="model.onnx", int8_file="model.int8.onnx",
                   checked_file="model.int8-checked.onnx")  # fmt: skip
    assert new.onnx_for("int8-checked") == "model.int8-checked.onnx"
    assert new.onnx_for("int8") == "model.int8.onnx"
    assert "model.int8-checked.onnx" in new.files()  # fingerprinted with the rest
