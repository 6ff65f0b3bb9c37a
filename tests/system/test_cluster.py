"""benchmarks/cluster.py in its short mode: two nodes in network namespaces behind HAProxy, each
failure scenario with its pass mark (SIGTERM, SIGKILL, link down, rolling restart, in-place
--reuse-port upgrade). Needs root, iproute2 and haproxy (tests/install_browser.py installs it).
Its only fixed wait is the scenario's own link-down: traffic is known to flow when every client
has had an answer (before the scenarios, before and after the upgrade), and a scenario's window
ends when every request begun in it is answered (these were 2 s, 2 s, 1 s and 0.5 s sleeps)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from devkit.launcher import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 not installed"),
]

SCENARIOS = [
    "SIGTERM one node",
    "SIGKILL one front-end",
    "link down 2 s, then up",
    "rolling restart",
    "--reuse-port upgrade x1 (direct clients)",
]


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_cluster_short() -> None:
    before = namespaces()
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.cluster", "--short"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    print(run.stdout)
    rows = [json.loads(ln) for ln in run.stdout.splitlines() if ln.startswith('{"scenario"')]
    assert [r["scenario"] for r in rows] == SCENARIOS, run.stdout + run.stderr[-3000:]
    for r in rows:
        assert r["failed"] == 0 and r["pass"], r
    assert run.returncode == 0, run.stderr[-3000:]
    assert namespaces() == before  # every namespace it made is gone, with its links
