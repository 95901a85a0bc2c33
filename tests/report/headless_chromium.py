"""Open a local page in headless Chromium and read it through the DevTools protocol.

The protocol runs over a pipe (`--remote-debugging-pipe`: JSON messages ending in NUL on
file descriptors 3 and 4), so no WebSocket library and no network port is needed. Used
by the report tests, and to take the screenshot in docs/img/:

    python -m tests.report.headless_chromium RUN_DIR/report.html docs/img/report.png
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => ({
  alt: i.alt, complete: i.complete, natural_width: i.naturalWidth, natural_height: i.naturalHeight,
  width: i.getBoundingClientRect().width, height: i.getBoundingClientRect().height})))"""


def chromium_binary() -> str | None:
    """Debian's `chromium` (or chromium-browser / google-chrome) on PATH, else None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageResult:
    """What the page did: console errors and exceptions, its images, and a full-page PNG."""

    errors: list[str] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    screenshot_png: bytes = b""


class _Pipe:
    def __init__(self, binary: str, profile: str):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                f"--user-data-dir={profile}", "--remote-debugging-pipe", "--window-size=1100,900", "about:blank"]

        def fds():  # the protocol's fixed descriptors: 3 = commands in, 4 = replies out
            commands, replies = os.dup(to_browser_r), os.dup(from_browser_w)  # above 4 before 3, 4 are reused
            os.dup2(commands, 3)
            os.dup2(replies, 4)

        self.process = subprocess.Popen(args, preexec_fn=fds, close_fds=False,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"{method}: no reply within {timeout} s")

    def wait_for(self, method: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.events.append(self._read())

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


def open_page(page: Path, binary: str | None = None) -> PageResult:
    """Load `page` (a local file), wait for its load event, and report errors, images and a screenshot."""
    binary = binary or chromium_binary()
    if binary is None:
        raise FileNotFoundError("no chromium on PATH")
    with tempfile.TemporaryDirectory(prefix="flopwise-chromium-") as profile:
        pipe = _Pipe(binary, profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
            pipe.wait_for("Page.loadEventFired")
            images = json.loads(pipe.send("Runtime.evaluate", {"expression": IMAGES_JS, "returnByValue": True},
                                          session=session)["result"]["value"])
            metrics = pipe.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
            shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
                "x": 0, "y": 0, "width": metrics["width"], "height": metrics["height"], "scale": 1}}, session=session)
            result = PageResult(images=images, screenshot_png=base64.b64decode(shot["data"]))
            result.errors = _errors(pipe.events)
            return result
        finally:
            pipe.close()


def _errors(events: list[dict]) -> list[str]:
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(params["exceptionDetails"].get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            errors.append(params["entry"].get("text", "error"))
    return errors


if __name__ == "__main__":
    found = open_page(Path(sys.argv[1]))
    Path(sys.argv[2]).write_bytes(found.screenshot_png)
    print(json.dumps({"errors": found.errors, "images": found.images}, indent=2))
