"""Figures come from results files: the pictures and the machines page are what
benchmarks/pictures.py writes from them now, every results file has its machine (or says it has
none), and every table of figures in README.md and docs/ names an existing results file."""

from __future__ import annotations

from pathlib import Path

from benchmarks import machines, pictures
from devkit import figures


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


def test_every_table_of_figures_names_its_results_file() -> None:
    found = figures.findings()
    assert found == [], "\n".join(["name the results file beside each table:", *found])


def test_a_table_without_its_results_file_date_or_machine_is_found(tmp_path: Path) -> None:
    cited, absent = "serving-20261204T1950Z.txt", "serving-20991231T0000Z.txt"
    whole = "(2026-12-04, AMD EPYC (AVX-512))"
    table = "| c | texts/s |\n| --- | --- |\n| 32 | 550.0 |\n"
    page = tmp_path / "page.md"

    def found(intro: str) -> list[str]:
        page.write_text(f"# A\n\n{intro}\n\n{table}", encoding="utf-8")
        return figures.uncited(page, tmp_path)

    assert found(f"From `benchmarks/results/{cited}` {whole}:") == []
    assert "names no results file" in found(f"From `benchmarks/results/{absent}` {whole}:")[0]
    assert "date and machine" in found(f"From `benchmarks/results/{cited}` (2026-12-04):")[0]
    assert found("<!-- not-measured: a table of limits -->") == []


def test_a_paragraph_of_measured_figures_without_its_results_file_is_found(tmp_path: Path) -> None:
    cited, whole = "serving-20261204T1950Z.txt", "(2026-12-04, AMD EPYC (AVX-512))"
    page = tmp_path / "page.md"

    def found(text: str) -> list[str]:
        page.write_text(f"# A\n\n{text}\n", encoding="utf-8")
        return figures.unsourced_prose(page, tmp_path)

    measured = "Served at c=32 it ran 1.50x fp32 on short texts, P99 111.5 ms."
    assert "name no results file" in found(measured)[0]
    assert "name no results file" in found(f"- a list item: {measured}")[0]
    assert found(f"From `benchmarks/results/{cited}` {whole}: {measured}") == []
    # the section's earlier paragraph may name it, with its date and machine
    assert found(f"From `benchmarks/results/{cited}` {whole}.\n\n{measured}") == []
    assert "date and machine" in found(f"From `benchmarks/results/{cited}`: {measured}")[0]
    # ... but not another section's
    assert found(f"From `{cited}` {whole}.\n\n# B\n\n{measured}") != []
    # a whole number with a unit reads as a default or a limit; a constant may say so
    assert found("The deadline is 30 s and the body at most 1 MiB.") == []
    assert found("Tried again after 0.5 s. <!-- not-measured: a constant of the code -->") == []
    # figures in code fences are the commands' output, not prose
    assert found("```console\n$ x\n1.50x\n```") == []
