"""The README's option table is generated from service/settings.py and must not drift."""

from __future__ import annotations

from service.settings import SETTINGS, markdown_table
from tests.conftest import ROOT


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
