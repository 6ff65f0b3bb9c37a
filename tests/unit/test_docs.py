"""The README's option table is generated from service/settings.py and must not drift."""

from __future__ import annotations

import re

from ringserve.service.settings import SETTINGS, markdown_table

from devkit.launcher import ROOT


def test_readme_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme, "README options table is stale: regenerate it"
    for s in SETTINGS:
        assert f"`--{s.name}`" in readme


def test_readme_commands_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "make serve" in readme and "make test" in readme
    assert "\nserve:" in makefile and "\ntest:" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_docs_link_only_inside_the_repository() -> None:
    """README and docs/ stand alone in a clone: every relative link resolves, none leaves it."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) >= 3, pages
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "../shared" not in text, page
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            assert path.exists(), (page.name, target)
            assert path.is_relative_to(ROOT), (page.name, target)
