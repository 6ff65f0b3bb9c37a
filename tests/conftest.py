"""Shared test fixtures: a real `ringserve serve` process on free ports, and clean-up checks.

Nothing of ours is mocked: servers are real processes, talked to over real sockets. Waits poll
with a deadline; no test relies on a fixed sleep.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from service.cli import ctl_request

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"  # small samples with provenance (data/README.md)
OUTPUT = ROOT / "test-output"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class ServerProc:
    """A running `ringserve serve` child process and handy clients for it."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.binary_port = free_port()
        self.control = str(tmp / f"ctl-{self.port}.sock")
        self.log_path = tmp / f"server-{self.port}.log"
        self.args = [
            sys.executable, "-m", "service.cli", "serve",
            "--port", str(self.port),
            "--binary-port", str(self.binary_port),
            "--control", self.control,
            *args,
        ]  # fmt: skip
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, env=full_env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.pid = self.proc.pid

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
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def classify(self, text: str | list[str], **kw: Any) -> dict[str, Any]:
        body = {"text": text} if isinstance(text, str) else {"texts": text}
        status, _, data = self.request("POST", "/v1/classify", body, **kw)
        assert status == 200, (status, data)
        result: dict[str, Any] = json.loads(data)
        return result

    def ctl(self, cmd: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        return ctl_request(self.control, cmd, timeout)

    def status(self) -> dict[str, Any]:
        return self.ctl({"cmd": "status"})

    def ready_workers(self) -> int:
        return sum(1 for w in self.status()["workers"] if w["state"] in ("ready", "degraded"))

    def worker_pids(self) -> dict[int, int]:
        return {w["id"]: w["pid"] for w in self.status()["workers"] if w["id"] >= 0}

    # -- lifecycle ------------------------------------------------------------------------------
    def wait_ready(self, workers: int | None = None, timeout: float = 120.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise ServerDied(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            status, _, _ = self.request("GET", "/v2/health/ready", timeout=5)
            if status != 200:
                return False
            return workers is None or self.ready_workers() >= workers

        try:
            wait_for(ready, timeout, "server ready")
        except AssertionError:
            raise AssertionError(f"server not ready; log:\n{self.logs()[-4000:]}") from None

    def wait_spares(self, n: int = 1, timeout: float = 120.0) -> None:
        wait_for(
            lambda: sum(1 for w in self.status()["workers"] if w["state"] == "spare") >= n,
            timeout,
            "warm spare",
        )

    def logs(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait for the exit, and check nothing is left behind."""
        kids = self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            for k in kids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    k.kill()
            raise
        finally:
            self.log.close()
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
    from workers.artifact import default_artifact_dir

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
        *args: str, env: dict[str, str] | None = None, wait: bool = True, workers: int | None = None
    ) -> ServerProc:
        srv = ServerProc(tmp_path, list(args), env)
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
    srv = ServerProc(factory.mktemp(name), args)
    try:
        srv.wait_ready(workers)
    except BaseException:
        srv.stop()
        raise
    yield srv
    assert srv.stop() == 0


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
