"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages ended by a NUL byte on file descriptors 3 and 4), so one browser process loads many
pages without a WebSocket library. Used by tests/docs/test_site_chromium.py.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome") if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    """The browser answered a command with an error, or stopped answering."""


class Browser:
    """One headless Chromium with one tab; records what each page load reports."""

    def __init__(self, profile_dir: Path, width: int = 1200, height: int = 900, timeout: float = 30) -> None:
        self.timeout = timeout
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        chromium = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1", "--no-first-run",
                    "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", "about:blank"]
        # The browser reads commands on fd 3 and writes answers on fd 4: bash moves the pipe ends
        # there in the child (this process's own fds 3 and 4 stay as they are). --no-sandbox: tests
        # may run as root; everything it opens is served from 127.0.0.1.
        # (Through fds 10 and 11, as the pipe's own fds may be 3 or 4.)
        move = f'exec 10<&{to_browser_read} 11>&{from_browser_write} {to_browser_read}<&- {from_browser_write}>&- && exec 3<&10 4>&11 10<&- 11>&- "$@"'
        try:
            self._process = subprocess.Popen(["bash", "-c", move, "chromium", *chromium], pass_fds=(to_browser_read, from_browser_write), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(to_browser_read)
            os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.command("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.command("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.command(f"{domain}.enable", session=True)
        self.command("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self._process.poll() is not None:
                raise BrowserError("chromium stopped answering")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise BrowserError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def command(self, method: str, session: bool = False, **params) -> dict:
        """Sends a command and returns its result; events that arrive meanwhile are kept."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer["result"]
            self.events.append(answer)

    def wait_for(self, method: str) -> dict:
        """The first recorded event ``method`` (waiting for it), removed from the record."""
        deadline = time.monotonic() + self.timeout
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(index)
            self.events.append(self._read_message(deadline))

    def load(self, url: str) -> list[dict]:
        """Navigates to ``url``, waits for its load event, and returns the events of the load."""
        self.events.clear()
        self.command("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")
        # Scripts run on load (highlighting, search set-up); let them finish and report.
        self.evaluate("new Promise(resolve => setTimeout(resolve, 50))")
        events, self.events = self.events, []
        return events

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.command("Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, full_page: bool = False) -> None:
        params = {"format": "png", "captureBeyondViewport": full_page}
        path.write_bytes(base64.b64decode(self.command("Page.captureScreenshot", session=True, **params)["data"]))

    def close(self) -> None:
        try:
            self.command("Browser.close")
        except BrowserError:
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


def problems_in(events: list[dict]) -> list[str]:
    """What a page load reported that a reader would see as broken: script errors, console
    errors, requests that failed or answered 4xx/5xx."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append(f"script error: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append("console.error: " + " ".join(str(arg.get("value", arg.get("description"))) for arg in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            found.append(f"request failed: {params.get('errorText')} ({params.get('type')})")
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            found.append(f"HTTP {params['response']['status']}: {params['response']['url']}")
    return found
