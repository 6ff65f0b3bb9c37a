"""docs/design.md stays an architecture and stays true: at most 700 lines, its house map names
every production module and no module that is gone, and each module its request walks name
exists."""

from __future__ import annotations

import re

from benchmarks import pictures
from devkit.launcher import ROOT

DESIGN = ROOT / "docs" / "design.md"
PACKAGES = ("service", "workers", "shm", "wire", "factory")
MAX_LINES = 700


def production_modules() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py"
    }


def house_map() -> set[str]:
    """The modules the first text block under "## The house" names: a folder line (`service/`,
    at the margin) then its modules, indented (`  app.py   the composition root`)."""
    text = DESIGN.read_text(encoding="utf-8").split("## The house", 1)[1]
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    named, folder = set(), ""
    for line in block.splitlines():
        if m := re.match(r"^(\S+/)", line):
            folder = m[1]
        elif m := re.match(r"^\s+(\S+\.py)\b", line):
            named.add(folder + m[1])
    return named


def test_design_is_at_most_700_lines() -> None:
    lines = DESIGN.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, (
        f"docs/design.md is {len(lines)} lines; measurements go to docs/benchmarks/"
    )


def test_the_house_map_names_every_module_and_only_those() -> None:
    named, present = house_map(), production_modules()
    assert len(present) > 100
    missing, gone = sorted(present - named), sorted(named - present)
    assert not missing, f"add a line for each to docs/design.md's house map: {missing}"
    assert not gone, f"docs/design.md's house map names modules that are gone: {gone}"


def test_the_house_map_check_sees_a_missing_module() -> None:
    assert "service/app.py" in house_map()
    assert "service/engine/admission.py" in house_map()
    assert "service/protocols/rpc/http2/codec.py" in house_map()


def test_each_walk_names_modules_that_exist() -> None:
    walks = pictures.walks()
    assert {"A /v1 call", "A gRPC ModelInfer"} <= set(walks)
    for steps in walks.values():
        assert len(steps) >= 5
        for where, _ in steps:
            path = where.split()[0]
            assert (ROOT / path).exists(), where
