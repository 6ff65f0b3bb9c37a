"""Figures come from results files: the pictures and the machines page are what
benchmarks/pictures.py writes from them now, and every results file has its machine (or says it
has none)."""

from __future__ import annotations

from benchmarks import machines, pictures


def test_pictures_and_machines_page_are_current() -> None:
    assert pictures.stale() == [], "run `python -m benchmarks.pictures` and commit what it writes"


def test_machines_page_lists_every_results_file() -> None:
    page = machines.PAGE.read_text(encoding="utf-8")
    for path in machines.results_files():
        assert f"`{path.name}`" in page, path.name


def test_machines_are_read_from_each_way_a_file_records_one() -> None:
    results = machines.RESULTS
    assert machines.label(results / "serving-20261204T1950Z.txt") == "AMD EPYC (AVX-512)"
    assert machines.label(results / "runtimes-2026-12-06T0507Z-amx.txt") == "Intel Xeon (AMX)"
    assert machines.label(results / "shedding-20261205T2005Z.txt") == "AMD EPYC (AVX2)"
    assert machines.label(results / "chaos-20261205T1309Z.txt") == machines.NOT_RECORDED
    assert machines.date_of(results / "runtimes-2026-12-05T1343.txt") == "2026-12-05"
