"""Every folder of the installed package is listed in pyproject.toml: a folder left out is
missing from a non-editable install (`pip install .`, the container), while an editable
install and the tests still find it."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

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


def test_torch_is_the_full_extra_not_a_core_dependency() -> None:
    """`pip install .` (the CPU serving image's install) serves built artifacts without torch;
    building them is the `full` extra's (make install takes it)."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", dep, maxsplit=1)[0] for dep in conf["dependencies"]}
    assert not names & {"torch", "onnx", "safetensors"}, names
    assert {"onnxruntime", "openvino", "tokenizers"} <= names
    full = {
        re.split(r"[<>=\[ ]", dep, maxsplit=1)[0] for dep in conf["optional-dependencies"]["full"]
    }
    assert full == {"torch", "onnx", "safetensors"}
    assert ".[full]" in (ROOT / "Makefile").read_text()


def test_without_torch_the_commands_that_need_it_say_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from ringserve.factory import build
    from ringserve.service import cli
    from ringserve.workers.artifact import ArtifactError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    for command in ("export", "train", "evaluate"):
        assert cli.main([command, "--help"]) == 2
        said = capsys.readouterr().err
        assert f"ringserve {command}: needs torch" in said and "ringserve[full]" in said, said
    from ringserve.service.models.info import torch_refusal

    assert torch_refusal("onnx") is None and torch_refusal("openvino") is None
    assert "ringserve[full]" in (torch_refusal("torch") or "")
    with pytest.raises(ArtifactError, match=r"needs torch.*ringserve\[full\].*--model DIR"):
        build._build_default(tmp_path / "default")
    assert not (tmp_path / "default").exists()


def test_with_torch_every_runtime_may_serve() -> None:
    from ringserve.service.models.info import torch_refusal

    assert all(torch_refusal(r) is None for r in ("torch", "onnx", "openvino"))
