"""A wheel built from the repository installs one top-level package, `ringserve` (its rooms
`ringserve.service`, `.workers`, `.shm`, `.wire`, `.factory`), and the `ringserve` command:
nothing named `service`, `workers`, `shm`, `benchmarks`, `devkit` or `tests` lands in a user's
site-packages beside other packages' modules of those names (pyproject.toml [tool.setuptools]).

The build runs on a copy of the tree (the build writes build/ and egg-info beside the sources),
without build isolation: the installed setuptools is the backend, so it needs no index. The copy
leaves out every hidden file and folder: .git, the virtualenvs (`make install-test` puts the
1.6 GB .venv-pylate beside .venv; copying it took 20 s of this test's 21) and the tools' caches."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from devkit.launcher import ROOT

NOT_SOURCES = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "test-output")


def test_the_wheel_holds_ringserve_alone(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "wheel"
    shutil.copytree(ROOT, src, symlinks=True, ignore=NOT_SOURCES)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    build = subprocess.run(
        [*cmd, "-w", str(out), str(src)], capture_output=True, text=True, timeout=300
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = out.glob("ringserve-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        top_level = archive.read(f"{info}/top_level.txt").decode().split()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert {n.split("/")[0] for n in names} == {"ringserve", info}
    assert top_level == ["ringserve"]
    for part in ("devkit", "benchmarks", "tests"):
        assert not [n for n in names if part in n.split("/")], part
    for room in ("service", "workers", "shm", "wire", "factory"):
        assert f"ringserve/{room}/__init__.py" in names, room
    assert "ringserve/service/ops/static/dashboard.html" in names  # package data comes along
    assert "ringserve = ringserve.service.cli:main" in entry_points
