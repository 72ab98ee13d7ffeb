"""A real headless Chromium, driven over the DevTools protocol on a pipe (no driver, no port).

Chromium reads protocol messages on fd 3 and writes on fd 4, each a JSON object ended by a NUL
byte. This helper opens one page, records what a person would see in the DevTools console
(console.* calls, uncaught exceptions, browser log entries such as CSP violations) and every
request the page makes, and takes screenshots.

Where no Chromium is installed the tests that need one skip, unless KSEARCH_REQUIRE_BROWSER=1
(set by .ci/run), where they fail: CI must not pass a browser test it never ran.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    message = f"no headless browser found (looked for {', '.join(CANDIDATES)}); on Debian: apt-get install chromium"
    if os.environ.get("KSEARCH_REQUIRE_BROWSER") == "1":
        pytest.fail(message + " (KSEARCH_REQUIRE_BROWSER=1)")
    pytest.skip(message)


class Browser:
    def __init__(self, width: int = 1280, height: int = 900, timeout_s: float = 30.0):
        chromium = find_chromium()
        self.timeout_s = timeout_s
        self.profile = tempfile.TemporaryDirectory(prefix="ksearch-chromium-")
        ours_r, theirs_w = os.pipe()  # the browser writes (its fd 4), we read
        theirs_r, ours_w = os.pipe()  # we write, the browser reads (its fd 3)
        # The browser's ends go to fds >= 10 first, so that the shell's moves to 3 and 4 cannot
        # clobber one with the other; bash (not sh: it takes fds above 9) wires them up without a preexec_fn (unsafe in a
        # process with threads, such as one running Ray).
        r, w = fcntl.fcntl(theirs_r, fcntl.F_DUPFD, 10), fcntl.fcntl(theirs_w, fcntl.F_DUPFD, 10)
        os.close(theirs_r)
        os.close(theirs_w)
        args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--remote-debugging-pipe", f"--user-data-dir={self.profile.name}", f"--window-size={width},{height}",
                "--hide-scrollbars", "about:blank"]
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{r} 4>&{w} {r}<&- {w}>&-', "bash", *args],
            pass_fds=(r, w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(r)
        os.close(w)
        self.rfd, self.wfd = ours_r, ours_w
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)

    # --- protocol ------------------------------------------------------------------------------

    def _send(self, method: str, params: dict[str, Any] | None, session: bool) -> int:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self.wfd, json.dumps(message).encode() + b"\0")
        return self.next_id

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.rfd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the protocol pipe (exit status {self.proc.poll()})")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False) -> dict[str, Any]:
        wanted = self._send(method, params, session)
        while True:
            message = self._receive(self.timeout_s)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def _drain(self, quiet_s: float) -> None:
        try:
            while True:
                self.events.append(self._receive(quiet_s))
        except TimeoutError:
            pass

    # --- what a test needs -----------------------------------------------------------------------

    def open(self, path: Path) -> None:
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session=True)
        deadline = time.monotonic() + self.timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._receive(max(0.1, deadline - time.monotonic())))
        self._drain(0.5)  # scripts that run after load get to complain too

    def console_errors(self) -> list[str]:
        """Everything the DevTools console would show as an error or a warning."""
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                found.append(params["exceptionDetails"].get("exception", {}).get("description") or params["exceptionDetails"]["text"])
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                found.append(params["entry"]["text"])
        return found

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def evaluate(self, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails'].get('text')}")
        return reply["result"].get("value")

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def screenshot(self, *, full_page: bool = False) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
            params |= {"captureBeyondViewport": True,
                       "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}}
        return base64.b64decode(self.call("Page.captureScreenshot", params, session=True)["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.rfd)
        os.close(self.wfd)
        self.profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
