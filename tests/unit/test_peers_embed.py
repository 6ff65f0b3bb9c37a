"""benchmarks/peers_embed.py's configurations: which options each server gets for fp32 and for the
faithful pair, and the cosine it checks the two servers' vectors by."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from benchmarks.peers_embed import cosine, options, pairs
from benchmarks.serving import stop_group, wait_health
from devkit.launcher import free_port


def test_fp32_is_ringserve_defaults_against_infinity_float32() -> None:
    assert pairs(options(["--configs", "fp32"])) == [("fp32", [], ["--dtype", "float32"])]


def test_faithful_adds_its_options_to_ringserves_every_run_options() -> None:
    args = options(["--ringserve-args", "--workers 2",
                    "--ringserve-faithful-args", "--precision bf16",
                    "--infinity-faithful-args", "--dtype bfloat16"])  # fmt: skip
    assert pairs(args) == [
        ("fp32", ["--workers", "2"], ["--dtype", "float32"]),
        ("faithful", ["--workers", "2", "--precision", "bf16"], ["--dtype", "bfloat16"]),
    ]


def test_configs_run_in_a_fixed_order_whatever_the_order_asked() -> None:
    assert [label for label, _, _ in pairs(options(["--configs", "faithful,fp32"]))] == [
        "fp32",
        "faithful",
    ]


def test_cosine() -> None:
    assert math.isclose(cosine([1.0, 0.0], [2.0, 0.0]), 1.0)
    assert math.isclose(cosine([1.0, 0.0], [0.0, 3.0]), 0.0, abs_tol=1e-12)
    assert math.isclose(cosine([1.0, 1.0], [-1.0, -1.0]), -1.0)


HEALTH = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_wait_health_returns_on_200_and_names_an_early_exit() -> None:
    """Both peers' readiness wait (serving's LitServe/FastAPI, peers_embed's Infinity), on real
    processes: a server that answers /health is ready; one that exits first is an error with
    its log's tail; one that never answers times out."""
    port = free_port()
    up = subprocess.Popen([sys.executable, "-c", HEALTH, str(port)], start_new_session=True)
    try:
        wait_health(up, port, "the peer", 30.0)
    finally:
        stop_group(up)
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    with pytest.raises(RuntimeError, match="Infinity exited with 3:\nlast lines"):
        wait_health(gone, free_port(), "Infinity", 30.0, lambda: "last lines")
    mute = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            start_new_session=True)  # fmt: skip
    try:
        with pytest.raises(TimeoutError, match=r"the peer did not answer /health in 0\.3 s"):
            wait_health(mute, free_port(), "the peer", 0.3)
    finally:
        stop_group(mute)
