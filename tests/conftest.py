"""Shared test fixtures: a real `ringserve serve` process on free ports, and clean-up checks.

Nothing of ours is mocked: servers are real processes, talked to over real sockets. Waits poll
with a deadline; no test relies on a fixed sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from benchmarks.common import DATA, Launched, ServerExited, http_request

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output"


class ServerDied(Exception):
    """Raised from a wait_for predicate to stop polling at once."""


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll `predicate` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except ServerDied:
            raise
        except Exception as exc:  # noqa: BLE001 - keep polling; report the last one
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc})")


class ServerProc(Launched):
    """A running `ringserve serve` child process and handy clients for it."""

    # -- clients --------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> tuple[int, dict[str, str], bytes]:
        if isinstance(body, dict):
            body = json.dumps(body)
        return http_request(self.port, method, path, body, headers, timeout)

    def classify(self, text: str | list[str], **kw: Any) -> dict[str, Any]:
        body = {"text": text} if isinstance(text, str) else {"texts": text}
        status, _, data = self.request("POST", "/v1/classify", body, **kw)
        assert status == 200, (status, data)
        result: dict[str, Any] = json.loads(data)
        return result

    def status(self) -> dict[str, Any]:
        return self.ctl({"cmd": "status"})

    def worker_pids(self) -> dict[int, int]:
        return {w["id"]: w["pid"] for w in self.status()["workers"] if w["id"] >= 0}

    # -- lifecycle ------------------------------------------------------------------------------
    def wait_ready(self, workers: int | None = None, timeout: float = 120.0) -> None:
        try:
            super().wait_ready(workers, timeout)
        except (TimeoutError, ServerExited) as exc:
            raise AssertionError(f"server not ready: {exc}") from None

    def wait_spares(self, n: int = 1, timeout: float = 120.0) -> None:
        wait_for(
            lambda: sum(1 for w in self.status()["workers"] if w["state"] == "spare") >= n,
            timeout,
            "warm spare",
        )

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait for the exit, and check nothing is left behind."""
        kids = self.children()
        try:
            code = self.terminate(timeout)
        except subprocess.TimeoutExpired:
            for k in kids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    k.kill()
            raise
        _, alive = psutil.wait_procs(kids, timeout=10)
        assert not alive, f"worker processes left behind: {alive}"
        left = segments_of(self.pid)
        assert not left, f"shared-memory segments left behind: {left}"
        return code


def segments_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"rs_{pid}_"))


@pytest.fixture(scope="session")
def default_model() -> str:
    """Builds (once, into the user cache) and returns the default artifact directory."""
    from ringserve.factory.build import default_artifact_dir

    return str(default_artifact_dir())


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


@contextlib.contextmanager
def serving(srv: ServerProc, workers: int | None = None) -> Iterator[ServerProc]:
    """The body of every module-server fixture: wait until `srv` is ready (stopping it if it
    never is), hand it out, and check that it exits 0 when the module is done with it."""
    try:
        srv.wait_ready(workers)
    except BaseException:
        srv.stop()
        raise
    yield srv
    assert srv.stop() == 0


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
