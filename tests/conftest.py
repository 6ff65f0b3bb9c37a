"""Shared test fixtures: a real `ringserve serve` process on free ports, and clean-up checks.

Nothing of ours is mocked: servers are real processes, talked to over real sockets. Waits poll
with a deadline; no test relies on a fixed sleep.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devkit.builds import PLAIN_BUILDS
from devkit.exports import HfExports
from devkit.launcher import DATA
from devkit.server import ServerProc, serving


@pytest.fixture(scope="session")
def default_model() -> str:
    """Builds (once, into the user cache, whole: never with cheap_builds' settings, whichever
    module asks first) and returns the default artifact directory."""
    from ringserve.factory.build import default_artifact_dir

    old = {k: os.environ.pop(k, None) for k in PLAIN_BUILDS}
    try:
        return str(default_artifact_dir())
    finally:
        os.environ.update({k: v for k, v in old.items() if v is not None})


@pytest.fixture(scope="session")
def hf_exports(tmp_path_factory: pytest.TempPathFactory) -> HfExports:
    """The tiny Hugging Face classifiers (devkit/hfmodels.py), each saved and exported once a
    session, on first use (devkit/exports.py). Shared: copy a source or artifact to change it."""
    return HfExports(tmp_path_factory.mktemp("hf-exports"))


@pytest.fixture(scope="session")
def sst2_texts() -> list[str]:
    rows = (DATA / "sst2" / "sample.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [r.split("\t")[0] for r in rows[:2000]]


@pytest.fixture(scope="session")
def agnews_texts() -> list[str]:
    rows = (DATA / "ag_news" / "sample.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [r.split("\t")[0] for r in rows[:500]]


@pytest.fixture
def start_server(tmp_path: Path, default_model: str) -> Iterator[Callable[..., ServerProc]]:
    """Factory: start_server(*args, env=...) -> a ready ServerProc, stopped and checked after."""
    started: list[ServerProc] = []

    def start(
        *args: str,
        env: dict[str, str] | None = None,
        wait: bool = True,
        workers: int | None = None,
        beside: ServerProc | None = None,
        own_group: bool = False,
        grpc: bool = False,
    ) -> ServerProc:
        srv = ServerProc(tmp_path, list(args), env, beside=beside, own_group=own_group, grpc=grpc)
        started.append(srv)
        if wait:
            srv.wait_ready(workers)
        return srv

    yield start
    for srv in started:
        if srv.proc.poll() is None:
            srv.stop()
        else:
            srv.log.close()


def _module_server(
    factory: pytest.TempPathFactory, name: str, args: list[str], workers: int
) -> Iterator[ServerProc]:
    with serving(ServerProc(factory.mktemp(name), args), workers) as srv:
        yield srv


@pytest.fixture(scope="module")
def shared_server(
    tmp_path_factory: pytest.TempPathFactory, default_model: str
) -> Iterator[ServerProc]:
    """One server for a module of tests that do not disturb it (2 workers, 1 spare)."""
    yield from _module_server(tmp_path_factory, "srv", ["--workers", "2"], 2)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    """A small server (1 worker, no spare) for a module of protocol tests."""
    yield from _module_server(tmp_path_factory, "small", ["--workers", "1", "--spares", "0"], 1)
