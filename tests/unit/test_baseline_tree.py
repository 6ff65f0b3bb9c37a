"""A benchmark's baseline checkout (`--baseline DIR`) runs that checkout's code: the editable
install maps `ringserve` to this one whatever the working directory, so the launcher puts the
baseline's `.typecheck/ringserve` links first on PYTHONPATH (devkit/launcher.py `tree_path`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.launcher import tree_path


def test_a_baseline_tree_is_the_code_that_runs(tmp_path: Path) -> None:
    rooms = tmp_path / "service"
    rooms.mkdir()
    (rooms / "cli.py").write_text("WHICH = 'the baseline'\n")
    links = tmp_path / ".typecheck" / "ringserve"
    links.mkdir(parents=True)
    (links / "service").symlink_to(rooms)
    env = {**os.environ, "PYTHONPATH": tree_path(tmp_path, os.environ.get("PYTHONPATH", ""))}
    out = subprocess.run(
        [sys.executable, "-c", "import ringserve.service.cli as c; print(c.WHICH, c.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.startswith("the baseline ") and str(tmp_path) in out


def test_a_checkout_from_before_the_rooms_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="before the rooms"):
        tree_path(tmp_path)
