"""Headless Chromium driven over the DevTools protocol, with nothing but the standard library.

Chromium is started with `--remote-debugging-pipe`: it reads protocol commands from file descriptor
3 and writes answers and events to descriptor 4, each a JSON message ended by a NUL byte. That is
all a test needs to open a page, wait for what it shows and look at it (`evaluate`) or photograph
it (`screenshot`); no driver package, no network port.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The Chromium executable on PATH (Debian's package `chromium`), or None."""
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    return None


class BrowserError(RuntimeError):
    pass


def _above_4(fd: int) -> int:
    """`fd` moved above 4, so that the child's dup2 onto 3 and 4 never meets its own source."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Browser:
    """One headless Chromium with one page; `with Browser() as b: b.open(url)`."""

    def __init__(self, executable: str, width: int = 1600, height: int = 1000):
        self.executable = executable
        self.width, self.height = width, height
        self._next_id = 0
        self._buffer = b""

    def __enter__(self) -> Browser:
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        to_browser_read, to_browser_write = map(_above_4, os.pipe())
        from_browser_read, from_browser_write = map(_above_4, os.pipe())

        def give_pipes() -> None:  # in the child: its descriptors 3 and 4 are the pipes
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        self._process = subprocess.Popen(
            [
                self.executable,
                "--headless",
                "--no-sandbox",  # tests may run as root, which Chromium's sandbox refuses
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile.name}",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=give_pipes,
            pass_fds=(3, 4),
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._out = os.fdopen(to_browser_write, "wb", buffering=0)
        self._in = os.fdopen(from_browser_read, "rb", buffering=0)
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(BrowserError, OSError):  # it may be gone already
            self._call("Browser.close", timeout_s=10)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._out.close()
        self._in.close()
        self._profile.cleanup()

    def call(self, method: str, params: dict | None = None, timeout_s: float = 60) -> dict:
        """A protocol command on the page's session."""
        return self._call(method, params, session=self._session, timeout_s=timeout_s)

    def open(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        answer = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression!r} failed: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60, what: str = "") -> Any:
        """Poll `expression` until it is truthy; its value. Raises with `what` on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(
                    f"timed out after {timeout_s:.0f} s waiting for {what or expression}"
                )
            time.sleep(0.25)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def _call(
        self,
        method: str,
        params: dict | None = None,
        *,
        session: str | None = None,
        timeout_s: float = 60,
    ) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self._read(deadline)
            if answer.get("id") != self._next_id:
                continue  # an event, or the answer to an earlier command
            if "error" in answer:
                raise BrowserError(f"{method}: {answer['error']}")
            return answer.get("result", {})

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise BrowserError("Chromium did not answer in time")
            chunk = self._in.read(1 << 16)
            if not chunk:
                raise BrowserError("Chromium closed its protocol pipe (did it crash?)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)
