"""Headless Chromium spoken to over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages separated by NUL bytes on file descriptors 3 and 4), so the dashboard tests need no
Python package beyond the standard library. Chromium is Debian's `chromium` package
(`python tests/install_browser.py` installs it as root)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _high(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Browser:
    """Headless Chromium with one page, spoken to over the DevTools pipe."""

    def __init__(self, profile: Path) -> None:
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        # Move the child's ends above 9 so that `3<&N 4>&M` cannot clobber one with the other
        # (pytest's capturing leaves low descriptors in any order); bash, since dash takes
        # only one-digit descriptors in redirections.
        to_browser_r, from_browser_w = (_high(to_browser_r), _high(from_browser_w))
        args = [
            str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", "--no-first-run", "--remote-debugging-pipe",
            f"--user-data-dir={profile}", "--window-size=1440,900", "about:blank",
        ]  # fmt: skip
        # The browser reads commands on fd 3 and writes answers on fd 4.
        redirect = f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        self.proc = subprocess.Popen(
            ["bash", "-c", redirect, "bash", *args],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buffer = b""
        self.next_id = 0
        self.session: str | None = None
        self.errors: list[str] = []  # uncaught exceptions and console errors of the page

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._next_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self._note_event(reply)

    def _next_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_browser], [], [], left)[0]:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed its DevTools pipe")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def _note_event(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(json.dumps(params.get("args", []))[:500])

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.call("Runtime.enable")
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def resize(self, width: int, height: int = 900) -> None:
        """Lay the page out as a window `width` CSS pixels wide."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip

    def wait_eval(self, expression: str) -> Any:
        """An expression whose value is a promise, awaited."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def image_facts(self, png: Path) -> dict[str, Any]:
        """A PNG's size and how varied its pixels are, decoded by the browser (a blank page is
        one colour): {width, height, colours (distinct among a sample), dark (share of pixels
        darker than mid grey)}."""
        data = base64.b64encode(png.read_bytes()).decode()
        return dict(self.wait_eval(IMAGE_FACTS % data))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_browser)
        os.close(self.from_browser)


CARD = "document.querySelector('.card[data-worker-id=\"0\"]')"

# Every element of a <section> that reaches past that section's box (its panel), as
# "section-id: tag.class (left..right outside left..right)"; hidden sections are skipped.
PAST_PANEL = """(() => {
  const out = [];
  for (const section of document.querySelectorAll("main > section")) {
    if (section.hidden || section.offsetParent === null) continue;
    const box = section.getBoundingClientRect();
    for (const el of section.querySelectorAll("*")) {
      const r = el.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5) {
        out.push(`${section.id || section.className}: ${el.tagName.toLowerCase()}` +
          `.${el.className} (${Math.round(r.left)}..${Math.round(r.right)} outside ` +
          `${Math.round(box.left)}..${Math.round(box.right)})`);
      }
    }
  }
  return out;
})()"""


def card_field(b: Browser, field: str) -> str | None:
    value: str | None = b.eval(f"{CARD}?.querySelector('.w-{field}')?.textContent ?? null")
    return value


# Decodes a PNG into a canvas and samples every 7th pixel (the browser's own PNG decoder).
IMAGE_FACTS = """(async () => {
  const img = new Image();
  img.src = "data:image/png;base64,%s";
  await img.decode();
  const c = document.createElement("canvas");
  c.width = img.width; c.height = img.height;
  const ctx = c.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  const seen = new Set();
  let dark = 0, n = 0;
  for (let i = 0; i < d.length; i += 4 * 7) {
    seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
    if (d[i] + d[i + 1] + d[i + 2] < 384) dark++;
    n++;
  }
  return {width: img.width, height: img.height, colours: seen.size, dark: dark / n};
})()"""
