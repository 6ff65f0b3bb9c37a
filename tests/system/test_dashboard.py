"""/dashboard and /docs in headless Chromium (devkit.browser): live data under load, a killed
worker's card; three models under light load (the models table inside its panel at 1400 and
800 px, every model named in the header, a slot's served count kept across the roll of a model
unload); Swagger UI at /docs on the operator port, nothing fetched from elsewhere."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.browser import CARD, CHROMIUM, PAST_PANEL, Browser, card_field
from devkit.http import http_request
from devkit.launcher import OUTPUT, free_port
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


# -- three models, and /docs, on the operator port -------------------------------------------------
MODELS = ("sentiment-alpha", "sentiment-beta", "sentiment-gamma")


def three_models(path: Path, model: str, names: tuple[str, ...] = MODELS) -> Path:
    tables = "".join(f'[models.{n}]\npath = "{model}"\n\n' for n in names)
    path.write_text(f"workers = 1\nspares = 0\n\n{tables}")
    return path


def test_three_models_and_the_docs_page(
    start_server: Any, browser: Browser, tmp_path: Path, default_model: str
) -> None:
    config = three_models(tmp_path / "three.toml", default_model)
    operator = free_port()
    srv = start_server("--config", str(config), "--operator-port", str(operator), workers=1)
    texts = ["a warm, funny film", "flat and lifeless"]
    loads = [Load(srv.port, texts, clients=1, pause_s=0.05, model=m) for m in MODELS]
    with contextlib.ExitStack() as stack:
        for load in loads:
            stack.enter_context(load)
        browser.open(f"http://127.0.0.1:{operator}/dashboard")
        try:
            check_models_fit(browser)
            check_served_kept(srv, browser, config, default_model)
            check_docs_page(srv, browser, operator)
        except BaseException:
            with contextlib.suppress(Exception):
                browser.screenshot(OUTPUT / "dashboard-models-failure.png")
            raise
    assert all(load.ok() > 0 for load in loads)
    assert not browser.errors, browser.errors


def check_models_fit(b: Browser) -> None:
    rows = "document.querySelectorAll('#models tr').length"
    wait_for(lambda: b.eval(rows) == 3, 30, "a row per model")
    header = b.eval("document.getElementById('model').textContent")
    assert all(name in header for name in MODELS), header
    for width in (1400, 800):
        b.resize(width)
        laid_out = f"window.innerWidth === {width}"
        wait_for(lambda: b.eval(laid_out), 10, f"the page laid out {width} px wide")  # noqa: B023
        b.screenshot(OUTPUT / f"dashboard-models-{width}.png")
        past = b.eval(PAST_PANEL)
        assert past == [], (width, past)
        page = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        assert b.eval(page), width  # nothing makes the page itself scroll sideways


def check_served_kept(srv: ServerProc, b: Browser, config: Path, model: str) -> None:
    """Unloading a model rolls the workers onto the rest: slot 0's new process keeps its
    slot's count going."""
    wait_for(lambda: int(card_field(b, "served") or 0) > 10, 30, "worker 0 serving")
    before = int(card_field(b, "served") or 0)
    old = srv.worker_pids()[0]
    three_models(config, model, MODELS[:2])
    os.kill(srv.pid, signal.SIGHUP)
    wait_for(lambda: srv.worker_pids().get(0) not in (None, old), 60, "slot 0 rolled")
    wait_for(lambda: card_field(b, "pid") == str(srv.worker_pids()[0]), 15, "the new pid shown")
    assert int(card_field(b, "served") or 0) >= before
    header = "document.getElementById('model').textContent"
    wait_for(lambda: MODELS[2] not in b.eval(header), 15, "the header without the unloaded one")


def check_docs_page(srv: ServerProc, b: Browser, operator: int) -> None:
    assert srv.request("GET", "/docs")[0] == 404  # on the operator port only
    status, _, page = http_request(operator, "GET", "/docs")
    assert status == 200
    links = re.findall(rb'(?:src|href)="([^"]+)"', page)
    assert links and not [u for u in links if b"//" in u], links  # nothing from elsewhere
    b.open(f"http://127.0.0.1:{operator}/docs")
    b.resize(1400, 1000)
    ops = "[...document.querySelectorAll('.opblock-summary-path')].map(e => e.textContent)"
    paths = wait_for(lambda: (p := b.eval(ops)) and len(p) > 10 and p, 30, "the operations")
    doc = json.loads(srv.request("GET", "/openapi.json")[2])  # the HTTP port's API
    shown = {p.replace("\u200b", "") for p in paths}
    assert {"/v1/classify", "/v1/embeddings", "/v2/models/{model}/infer"} <= shown, shown
    assert shown == set(doc["paths"]), set(doc["paths"]) ^ shown
    loaded = b.eval("performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(u.startswith(f"http://127.0.0.1:{operator}/") for u in loaded), loaded
    shot = OUTPUT / "docs.png"
    b.screenshot(shot)
    facts = b.image_facts(shot)
    assert (facts["width"], facts["height"]) == (1400, 1000), facts
    assert facts["colours"] > 20 and 0.005 < facts["dark"] < 0.6, facts  # text on a page
