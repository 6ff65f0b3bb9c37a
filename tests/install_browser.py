"""Installs what the tests need from Debian when it is missing: chromium (the dashboard browser
test), haproxy (tests/system/test_cluster.py, benchmarks/cluster.py) and h2load (nghttp2-client:
tests/system/test_h2_attacks.py drives the gRPC port with it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

NEEDED = {
    "chromium": "chromium",
    "haproxy": "haproxy",
    "h2load": "nghttp2-client",
}  # command: package


def main() -> int:
    missing = [pkg for cmd, pkg in NEEDED.items() if not shutil.which(cmd)]
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
