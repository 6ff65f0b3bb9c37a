"""benchmarks/peers_embed.py's configurations: which options each server gets for fp32 and for the
faithful pair, and the cosine it checks the two servers' vectors by."""

from __future__ import annotations

import math

from benchmarks.peers_embed import cosine, options, pairs


def test_fp32_is_ringserve_defaults_against_infinity_float32() -> None:
    assert pairs(options(["--configs", "fp32"])) == [("fp32", [], ["--dtype", "float32"])]


def test_faithful_adds_its_options_to_ringserves_every_run_options() -> None:
    args = options(["--ringserve-args", "--workers 2",
                    "--ringserve-faithful-args", "--precision bf16",
                    "--infinity-faithful-args", "--dtype bfloat16"])  # fmt: skip
    assert pairs(args) == [
        ("fp32", ["--workers", "2"], ["--dtype", "float32"]),
        ("faithful", ["--workers", "2", "--precision", "bf16"], ["--dtype", "bfloat16"]),
    ]


def test_configs_run_in_a_fixed_order_whatever_the_order_asked() -> None:
    assert [label for label, _, _ in pairs(options(["--configs", "faithful,fp32"]))] == [
        "fp32",
        "faithful",
    ]


def test_cosine() -> None:
    assert math.isclose(cosine([1.0, 0.0], [2.0, 0.0]), 1.0)
    assert math.isclose(cosine([1.0, 0.0], [0.0, 3.0]), 0.0, abs_tol=1e-12)
    assert math.isclose(cosine([1.0, 1.0], [-1.0, -1.0]), -1.0)
