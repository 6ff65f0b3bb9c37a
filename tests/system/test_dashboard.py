"""/dashboard in headless Chromium (devkit.browser): live data under load, and a killed
worker's card."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.browser import CARD, CHROMIUM, Browser, card_field
from devkit.launcher import OUTPUT
from devkit.load import Load
from devkit.server import ServerProc, wait_for

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed and could not be: run `python tests/install_browser.py` "
    "as root (apt-get install chromium), as `make test` does",
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path / "chromium-profile")
    try:
        yield b
    finally:
        b.close()


def test_dashboard_live(start_server: Any, browser: Browser) -> None:
    srv = start_server("--workers", "1", "--spares", "1", workers=1)
    srv.wait_spares(1)
    shot = OUTPUT / "dashboard.png"
    texts = ["a warm, funny film", "flat and lifeless", "I would watch it again"]
    with Load(srv.port, texts, clients=1, batch=len(texts)) as load:
        browser.open(f"http://127.0.0.1:{srv.port}/dashboard")
        try:
            check_live_page(srv, browser, load)
            check_restart_shows(srv, browser)
        except BaseException:
            with contextlib.suppress(Exception):
                browser.screenshot(OUTPUT / "dashboard-failure.png")
            raise
        browser.screenshot(shot)
    assert shot.stat().st_size > 10_000
    assert load.ok() > 0
    assert not browser.errors, browser.errors


# Counts the page's fetches from now on (the page polls /v1/stats with the global fetch).
COUNT_POLLS = """(() => {
  window.rsPolls = 0;
  const fetch = window.fetch;
  window.fetch = (...args) => { window.rsPolls += 1; return fetch.apply(window, args); };
})()"""


def check_live_page(srv: ServerProc, b: Browser, load: Load) -> None:
    rate = "Number(document.getElementById('rps').textContent) || 0"
    wait_for(lambda: b.eval(rate) > 0, 30, "a non-zero request rate on the page")
    workers = srv.status()["workers"]
    cards = "document.querySelectorAll('#workers .card').length"
    wait_for(lambda: b.eval(cards) == len(workers), 10, "one card per worker")
    serving = next(w for w in workers if w["id"] == 0)
    wait_for(lambda: card_field(b, "pid") == str(serving["pid"]), 10, "worker 0's pid")
    assert card_field(b, "state") == "ready"
    assert card_field(b, "restarts") == "0"
    p50 = "document.querySelector('#buckets tr[data-bucket=\"16\"]').children[2].textContent"
    assert b.eval(p50) != "\u2013"  # the page's placeholder before any answer
    assert b.eval("document.getElementById('gpu-section').hidden") is True
    # The page reuses its nodes: polls under steady load do not grow the document.
    nodes = "document.getElementsByTagName('*').length"
    first = b.eval(nodes)
    b.eval(COUNT_POLLS)
    # The page fetches, renders, then schedules its next fetch: a third fetch since the count
    # began means two whole polls were rendered after `first` was read.
    wait_for(lambda: b.eval("window.rsPolls") >= 3, 30, "two more polls of the page")
    assert b.eval(nodes) == first
    assert load.ok() > 0


def check_restart_shows(srv: ServerProc, b: Browser) -> None:
    old = srv.worker_pids()[0]
    os.kill(old, signal.SIGKILL)

    def replaced() -> int | None:
        pid = srv.worker_pids().get(0)
        return pid if pid not in (None, old) and srv.ready_workers() >= 1 else None

    new = wait_for(replaced, 60, "worker 0 replaced")
    wait_for(lambda: card_field(b, "restarts") == "1", 15, "the card's restart count")
    wait_for(lambda: card_field(b, "pid") == str(new), 15, "the card's new pid")
    note = card_field(b, "note") or ""
    assert f"pid {old}" in note and str(new) in note, note
    assert "flash" in b.eval(f"{CARD}.className")
