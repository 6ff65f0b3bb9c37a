"""The container image deploy/container/Containerfile makes, built here and run: `make image`
(deploy/container/build.sh: a debootstrap Debian base, torch's local CPU wheel), then the image
on the host's network bound to 127.0.0.1 only, checked as an operator would: ready, a classify,
the server's user, torch's build, SIGTERM within the stop timeout, and the image's size.

Slow (minutes of both cores the first time, a cached rebuild after) and it needs root and Docker:
`make test-deploy` runs it (RINGSERVE_TEST_DEPLOY=1); `make test` skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from devkit.http import http_request
from devkit.launcher import ROOT, free_port
from devkit.server import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("RINGSERVE_TEST_DEPLOY") != "1",
        reason="builds and runs the container image: `make test-deploy`",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="make image needs root (apt-get, dockerd)"),
]

IMAGE = "ringserve:test"
STOP_TIMEOUT_S = 45  # what the Containerfile's header tells `docker run --stop-timeout`
MAX_IMAGE_BYTES = 3 * 2**30  # the CPU build; a CUDA torch alone would be larger


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.returncode}\n{done.stderr}")
    return done.stdout.strip()


@pytest.fixture(scope="module")
def image() -> str:
    start = time.monotonic()
    build = subprocess.run(
        ["bash", str(ROOT / "deploy" / "container" / "build.sh")],
        cwd=ROOT, env={**os.environ, "IMAGE": IMAGE}, capture_output=True, text=True,
        timeout=3600, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(f"make image: {time.monotonic() - start:.0f} s (the layers before a change are reused)")
    assert shutil.which("docker")
    return IMAGE


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[tuple[str, int]]:
    name, port = f"ringserve-test-{os.getpid()}", free_port()
    docker(
        "run", "-d", "--name", name, "--network", "host", "--shm-size", "256m",
        "--stop-timeout", str(STOP_TIMEOUT_S), image,
        "--host", "127.0.0.1", "--port", str(port), "--binary-port", "0", "--grpc-port", "0",
    )  # fmt: skip
    try:
        yield name, port
    finally:
        logs = docker("logs", name, check=False, timeout=30)
        print(logs[-2000:])
        docker("rm", "-f", name, check=False)


def ready(port: int) -> bool:
    return http_request(port, "GET", "/v2/health/ready", timeout=5)[0] == 200


def test_the_image_is_a_cpu_build_of_a_bounded_size(image: str) -> None:
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image))
    versions = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c",
        "import sys, torch; print(torch.__version__, torch.version.cuda, sys.version.split()[0])",
    ).split()  # fmt: skip
    print(f"image {image}: {size / 2**20:.0f} MiB; torch {versions[0]}, CUDA {versions[1]}, "
          f"Python {versions[2]}")  # fmt: skip
    assert versions[0].endswith("+cpu") and versions[1] == "None"
    assert size < MAX_IMAGE_BYTES


def test_it_serves_on_loopback_as_a_user_and_stops_on_sigterm(container: tuple[str, int]) -> None:
    name, port = container
    start = time.monotonic()
    wait_for(lambda: ready(port), 180, "the container's server ready")
    print(f"ready {time.monotonic() - start:.1f} s after docker run")
    status, _, body = http_request(port, "POST", "/v1/classify", b'{"text": "a fine film"}')
    assert status == 200, body
    answer = json.loads(body)
    assert answer["label"] in ("negative", "positive") and len(answer["scores"]) == 2

    # every process of the container runs as 10001, none as root
    top = docker("top", name, "-eo", "uid,pid,args").splitlines()[1:]
    uids = {line.split()[0] for line in top}
    print(f"container processes: {len(top)}, uids {uids}")
    assert uids == {"10001"}
    # bound to 127.0.0.1 only: the host's other addresses are not listened on
    listening = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    local = {line.split()[3] for line in listening if line.strip()}
    assert local == {f"127.0.0.1:{port}"}, local

    start = time.monotonic()
    docker("stop", "-t", str(STOP_TIMEOUT_S), name, timeout=STOP_TIMEOUT_S + 30)
    took = time.monotonic() - start
    code = docker("inspect", "-f", "{{.State.ExitCode}}", name)
    print(f"docker stop: {took:.2f} s, exit {code}")
    assert code == "0" and took < STOP_TIMEOUT_S
