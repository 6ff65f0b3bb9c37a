"""Installs what the tests need from Debian when it is missing: chromium (the dashboard browser
test), haproxy (tests/system/test_cluster.py, benchmarks/cluster.py), h2load (nghttp2-client:
tests/system/test_h2_attacks.py drives the gRPC port with it) and libb64 (perf_analyzer); and
Triton's perf_analyzer (tests/system/test_triton_tools.py) from PyPI into the virtual
environment's opt/perf_analyzer, apart from the test extra's tritonclient."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

NEEDED = {
    "chromium": "chromium",
    "haproxy": "haproxy",
    "h2load": "nghttp2-client",
}  # command: package
LIBRARIES = {"libb64.so.0d": "libb64-0d"}  # a shared library perf_analyzer links: its package
# perf_analyzer ships in tritonclient's wheel: 2.45 is the newest that runs on glibc 2.36 (2.60
# needs 2.38). It loads libcudart even without a GPU: nvidia-cuda-runtime-cu12 is that library
# alone (no torch). Both go into their own directory without dependencies, so the test extra's
# tritonclient and its numpy stay as they are.
PERF_ANALYZER = ["tritonclient==2.45.0", "nvidia-cuda-runtime-cu12==12.9.79"]
PERF_DIR = Path(sys.prefix) / "opt" / "perf_analyzer"


def has_library(name: str) -> bool:
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    return name in found.stdout


def install_perf_analyzer() -> None:
    if (PERF_DIR / "bin" / "perf_analyzer").exists():
        return
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(PERF_DIR),
         *PERF_ANALYZER],
        check=True,
    )  # fmt: skip


def main() -> int:
    install_perf_analyzer()
    missing = [pkg for cmd, pkg in NEEDED.items() if not shutil.which(cmd)]
    missing += [pkg for lib, pkg in LIBRARIES.items() if not has_library(lib)]
    if os.environ.get("RINGSERVE_SKIP_BROWSER_INSTALL") and "chromium" in missing:
        missing.remove("chromium")
    if not missing:
        return 0
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print(f"tests/install_browser.py: cannot install {missing} (not root or no apt-get)")
        return 0
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        check=True,
        env=env,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
