"""The docs cannot drift from the code: the generated reference pages (devkit/docgen.py) equal what
the code gives now, the README's headline table and chart are what benchmarks/chart.py makes of
the results file it names, and every relative link resolves inside the repository."""

from __future__ import annotations

import re

import yaml
from ringserve.service.config.settings import SETTINGS, markdown_table

from benchmarks import chart
from devkit import docgen
from devkit.launcher import ROOT

DOCS = ROOT / "docs"


def pages() -> list:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_generated_reference_pages_are_current() -> None:
    assert docgen.stale() == [], "run `python -m devkit.docgen` and commit docs/reference/"


def test_options_page_lists_every_setting() -> None:
    page = (DOCS / "reference" / "options.md").read_text(encoding="utf-8")
    assert markdown_table() in page
    for s in SETTINGS:
        assert f"`--{s.name}`" in page and f"`{s.env}`" in page


def test_cli_page_has_every_command_and_serve_option() -> None:
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    for command in docgen.COMMANDS:
        assert f"## ringserve {command}\n" in page
    serve = page.split("## ringserve serve\n")[1].split("\n## ")[0]
    for s in SETTINGS:
        assert f"--{s.name}" in serve, s.name


def test_readme_commands_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "make serve" in readme and "make test" in readme
    assert "\nserve:" in makefile and "\ntest:" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^test: .*\bdocs\b", makefile, re.M), "make test builds the docs"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)


def test_readme_headline_table_and_chart_come_from_the_results_file() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert chart.markdown_table() in readme, "run `python -m benchmarks.chart` and copy the table"
    assert chart.LATEST.name in readme
    svg = (DOCS / "assets" / "serving-peers.svg").read_text(encoding="utf-8")
    assert svg == chart.svg_chart(), "run `python -m benchmarks.chart`"


def test_chart_reads_every_cell_of_the_run() -> None:
    rows = chart.read_rows()
    assert {(r.mix, r.c) for r in rows} == {(m, c) for m in ("short", "long") for c in chart.LEVELS}
    cell = next(r for r in rows if (r.mix, r.c) == ("short", 32))
    assert (cell.ringserve, cell.peers) == (550.0, {"FastAPI": 307.1, "LitServe": 216.3})


def test_every_docs_page_is_in_the_site_nav() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)

    def leaves(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [x for v in node.values() for x in leaves(v)]
        if isinstance(node, list):
            return [x for v in node for x in leaves(v)]
        return []

    in_nav = set(leaves(config["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk == in_nav
    assert config["theme"]["font"] == "false"  # no Google fonts fetched when a page is viewed


def test_docs_link_only_inside_the_repository() -> None:
    """README and docs/ stand alone in a clone: every relative link resolves, none leaves it."""
    assert len(pages()) >= 10
    for page in pages():
        text = page.read_text(encoding="utf-8")
        assert "../shared" not in text, page
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            assert path.exists(), (page.name, target)
            assert path.is_relative_to(ROOT), (page.name, target)
