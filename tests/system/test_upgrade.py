"""Zero-downtime upgrade on one host: a second server with --reuse-port on the same ports, then
SIGTERM to the first. Real servers, real sockets, real load; every outcome is counted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from devkit.launcher import ROOT
from devkit.load import Load
from devkit.server import ServerProc, listening, wait_for


def handed_over(srv: ServerProc) -> list[str]:
    return sorted(
        json.loads(line)["name"]
        for line in srv.logs().splitlines()
        if "listener_handed_over" in line
    )


def test_reuse_port_upgrade_refuses_nothing(start_server, sst2_texts) -> None:
    """Two upgrades in a row (A -> B -> C, as blue/green alternates) under keep-alive clients and
    two clients that open a connection per request: nothing fails, nothing is refused or reset."""
    args = ["--reuse-port", "--workers", "1", "--spares", "0", "--drain-timeout-s", "10"]
    old = start_server(*args, workers=1)
    with (
        Load(old.port, sst2_texts, clients=2) as load,
        Load(old.port, sst2_texts, clients=1, fresh=True) as fresh,
        Load(old.port, sst2_texts, clients=1, fresh=True) as fresh2,
    ):
        load.wait_ok(20)
        for _ in range(2):
            new = start_server(*args, beside=old, wait=False)
            wait_for(lambda: listening(new), 120, "the new server listening")  # noqa: B023
            assert new.ready_workers() == 1
            assert handed_over(new) == ["binary", "http"]  # the old server's own sockets
            before = sum(fresh.outcomes.values())
            old.proc.send_signal(signal.SIGTERM)
            assert old.proc.wait(60) == 0
            assert old.stop() == 0
            load.wait_ok(20)  # the new server alone now serves every client
            wait_for(lambda: sum(fresh.outcomes.values()) > before + 10, 60, "fresh connections")  # noqa: B023
            old = new
    print(
        f"upgrade x2: keep-alive clients {dict(load.outcomes)}; "
        f"new-connection clients {dict(fresh.outcomes)} {dict(fresh2.outcomes)}"
    )
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    assert set(fresh.outcomes) == {"200"}, fresh.outcomes
    assert set(fresh2.outcomes) == {"200"}, fresh2.outcomes
    assert old.stop() == 0


def test_second_server_never_takes_a_live_control_socket(start_server, tmp_path) -> None:
    first = start_server("--workers", "1", "--spares", "0", workers=1)
    second = subprocess.run(
        [sys.executable, "-m", "ringserve.service.cli", "serve", "--port", "0",
         "--binary-port", "0",
         "--grpc-port", "0", "--control", first.control, "--workers", "1", "--spares", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    print(f"second server without --reuse-port: exit {second.returncode}")
    assert second.returncode != 0
    assert "belongs to a running server" in second.stderr
    assert first.status()["ok"]  # the first still owns and answers on its socket
