"""Every folder of the installed package is listed in pyproject.toml: a folder left out is
missing from a non-editable install (`pip install .`, the container), while an editable
install and the tests still find it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(conf["tool"]["setuptools"]["packages"])
    dirs = conf["tool"]["setuptools"]["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found - listed == set(), "add these to pyproject.toml's packages"


def test_the_license_is_declared_where_pip_and_readers_look() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert conf["license"] == "Apache-2.0" and conf["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "Copyright 2026 the ringserve authors" in text
    assert "Apache-2.0" in (ROOT / "README.md").read_text()


def test_the_changelog_has_the_policy_and_the_artifact_format_built_now() -> None:
    from ringserve.factory.build import ARTIFACT_FORMAT

    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## Compatibility policy" in text
    # a format bump is a user-visible change: the entry that brought it names it
    assert f"artifact format {ARTIFACT_FORMAT}" in text


def test_version_is_the_installed_packages() -> None:
    import subprocess
    import sys
    from importlib import metadata

    run = subprocess.run(
        [sys.executable, "-m", "ringserve.service.cli", "--version"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert run.stdout == f"ringserve {metadata.version('ringserve')}\n"
