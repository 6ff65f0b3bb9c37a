"""The server under test: `ServerProc` (a launched server with clients for it and a stop that
checks nothing is left behind), polling with a deadline, and `serving`, the body of every
module-server fixture."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil

from devkit.http import http_request
from devkit.launcher import Launched, ServerExited


class ServerDied(Exception):
    """Raised from a wait_for predicate to stop polling at once."""


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll `predicate` until it returns something truthy, or fail after `timeout` seconds,
    saying what `detail` answers then (the state that explains a time-out)."""
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
    said = ""
    if detail is not None:
        try:
            said = "\n" + detail()
        except Exception as exc:  # noqa: BLE001 - the time-out is the failure; say this too
            said = f"\n(detail failed: {exc!r})"
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (last error: {last_exc}){said}"
    )


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
        return http_request(self.port, method, path, body, headers, timeout, context=self.tls)

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


def listening(srv: ServerProc) -> bool:
    """Its `start` line is logged once its listeners are bound."""
    if srv.proc.poll() is not None:
        raise ServerDied(f"server exited {srv.proc.returncode}:\n{srv.logs()[-3000:]}")
    return any(
        json.loads(line).get("event") == "start"
        for line in srv.logs().splitlines()
        if line.startswith("{")
    )


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@contextlib.contextmanager
def serving(srv: ServerProc, workers: int | None = None) -> Iterator[ServerProc]:
    """The body of every module-server fixture: wait until `srv` is ready (stopping it if it
    never is), hand it out, and check that it exits 0 when the module is done with it. A
    fixture's own last checks go in the `with` body after its yield: the server is stopped
    (and checked for leftovers) even when one of them fails."""
    try:
        srv.wait_ready(workers)
    except BaseException:
        srv.stop()
        raise
    try:
        yield srv
    finally:
        code = srv.stop()
    assert code == 0
