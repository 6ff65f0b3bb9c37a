"""Installs what the dashboard browser test needs (Debian's chromium), when it is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def main() -> int:
    if shutil.which("chromium") or os.environ.get("RINGSERVE_SKIP_BROWSER_INSTALL"):
        return 0
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print("tests/install_browser.py: cannot install chromium (not root or no apt-get)")
        return 0
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
        check=True,
        env=env,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
