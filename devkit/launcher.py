"""A `ringserve serve` child on free ports, as the tests and the benchmarks start it, and the
paths and sample texts they share."""

from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from ringserve.service.cli import ctl_request
from ringserve.service.protocols.handover import socket_is_live

from devkit.http import HOST, http_request

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"  # small samples with provenance (data/README.md)
SST2 = DATA / "sst2" / "sample.tsv"
AG_NEWS = DATA / "ag_news" / "sample.tsv"
OUTPUT = ROOT / "test-output"  # what tests leave for a person to look at (screenshots)


_HANDED: set[int] = set()  # ports free_port gave out in this process


def ephemeral_low() -> int:
    """The lowest port the kernel gives to a client socket (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = HOST) -> int:
    """A port free now, below the kernel's ephemeral range. A port from bind(0) is ephemeral,
    and any client connection (a load test's, say) may take it before the server under test
    binds it: CI once failed a start with EADDRINUSE that way. Never one handed out before."""
    rng = random.Random()
    low = max(1025, min(ephemeral_low(), 65536) - 12000)
    high = min(ephemeral_low(), 65536)
    for _ in range(1000):
        port = rng.randrange(low, high)
        if port in _HANDED:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED.add(port)
        return port
    raise RuntimeError(f"no free port in {low}..{high}")


def load_texts(path: Path | str = SST2, n: int | None = None) -> list[str]:
    """The first column of a TSV with a header row (the samples in data/, or a full set)."""
    rows = Path(path).read_text(encoding="utf-8").splitlines()[1:]
    texts = [r.split("\t")[0] for r in rows if r.strip()]
    return texts[:n] if n is not None else texts


def inherited_env() -> dict[str, str]:
    """This process's environment less RINGSERVE_API_KEY: a key exported in the shell must not
    turn every server under test into a keyed one (a keyed server is asked for by `env`)."""
    return {k: v for k, v in os.environ.items() if k != "RINGSERVE_API_KEY"}


def tree_path(tree: Path, pythonpath: str = "") -> str:
    """PYTHONPATH that makes `ringserve` another checkout's code: its `.typecheck/ringserve`
    links name its rooms, and sys.path is searched before the editable install's finder (which
    maps `ringserve` to this checkout, whatever the working directory)."""
    names = Path(tree) / ".typecheck"
    if not (names / "ringserve").is_dir():
        raise ValueError(f"{tree} has no .typecheck/ringserve: a checkout from before the rooms")
    return os.pathsep.join(p for p in (str(names), pythonpath) if p)


class Launched:
    """A `ringserve serve` child on free ports, its output in a log file under `tmp`."""

    def __init__(
        self,
        tmp: Path | str,
        args: list[str],
        env: dict[str, str] | None = None,
        binary: bool = True,
        port: int | None = None,
        beside: Launched | None = None,
        own_group: bool = False,
        tree: Path | None = None,
        grpc: bool = False,
        tls: ssl.SSLContext | None = None,
        wrap: tuple[str, ...] = (),
    ) -> None:
        """`grpc`: serve the gRPC port too, on a free port (off unless asked: most servers
        here never use it, and none may take the default 8002 another test server holds).
        `beside`: share that server's ports and control path (a --reuse-port upgrade).
        `own_group`: start it in a session of its own, so a signal to its process group (as
        systemd, supervisord and `kill -TERM -PGID` send) reaches it and its children only.
        `tree`: run the server of another checkout (a baseline commit), not this one.
        `tls`: the client context its HTTP port is probed with (a server given --tls-cert in
        `args`).
        `wrap`: a command that execs the server's (its own pid stays the server's): `unshare`
        and a shell that mounts a private /dev/shm first, say."""
        tmp = Path(tmp)
        self.tls = tls
        self.port: int = beside.port if beside else port or free_port()
        self.binary_port: int = beside.binary_port if beside else free_port() if binary else 0
        self.grpc_port: int = beside.grpc_port if beside else free_port() if grpc else 0
        self.base_control: str = (
            beside.base_control if beside else str(tmp / f"ctl-{self.port}.sock")
        )
        self.control = self.base_control
        taken = beside is not None and socket_is_live(self.base_control)
        self.log_path = tmp / f"server-{self.port}{f'-{time.monotonic_ns()}' if beside else ''}.log"
        self.args = [
            *wrap, sys.executable, "-m", "ringserve.service.cli", "serve",
            "--host", HOST, "--port", str(self.port),
            "--binary-port", str(self.binary_port),
            # another checkout (`tree`, a baseline) may predate the option: there, off unless asked
            *(["--grpc-port", str(self.grpc_port)] if tree is None or grpc else []),
            "--control", self.control,
            *args,
        ]  # fmt: skip
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        environ = {**inherited_env(), **(env or {})}
        if tree is not None:
            environ["PYTHONPATH"] = tree_path(tree, environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            self.args, cwd=tree or ROOT, env=environ, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=own_group,
        )  # fmt: skip
        self.pid = self.proc.pid
        if taken:  # its own control socket beside the live one (CONTRACT.md)
            self.control = f"{self.base_control}.{self.pid}"

    @property
    def url(self) -> str:
        return f"{'http' if self.tls is None else 'https'}://{HOST}:{self.port}"

    def logs(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def ctl(self, cmd: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        return ctl_request(self.control, cmd, timeout)

    def ready_workers(self) -> int:
        rows = self.ctl({"cmd": "status"})["workers"]
        assert isinstance(rows, list)
        return sum(1 for w in rows if w["state"] in ("ready", "degraded"))

    def is_ready(self, workers: int | None = None) -> bool:
        if self.proc.poll() is not None:
            raise ServerExited(f"server exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
        try:
            status, _, _ = http_request(
                self.port, "GET", "/v2/health/ready", timeout=5, context=self.tls
            )
        except OSError:
            return False
        return status == 200 and (workers is None or self.ready_workers() >= workers)

    def wait_ready(self, workers: int | None = None, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.is_ready(workers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready in {timeout} s; log:\n{self.logs()[-4000:]}")
            time.sleep(0.05)

    def cpu_s(self) -> float:
        t = psutil.Process(self.pid).cpu_times()
        return float(t.user + t.system)

    def wait_exit(self, timeout: float) -> int:
        """Wait for the server to exit by itself (a start that must fail); SIGTERM if it won't."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        return self.terminate()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; SIGKILL (and raise) if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self.log.close()


class ServerExited(Exception):
    """The server process ended while something waited for it."""
