"""Render a page in headless Chromium and report what a user's browser would show: console errors, uncaught
exceptions, images that did not decode, and a full-page screenshot.

The driver speaks the Chrome DevTools protocol over Chromium's ``--remote-debugging-port`` with ``websocket-client``
(a small pure-Python package on PyPI): no browser download (Debian's ``chromium`` is used as installed), no driver
binary whose version must match the browser (as selenium's chromedriver would need), no asyncio. Chromium runs with
a fresh ``--user-data-dir`` and with every background network feature off, so a test never reaches the network.
"""

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from typing import Any, Dict, List, Optional

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> Optional[str]:
    """Path of a Chromium binary (Debian's ``chromium`` first), or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def missing_reason() -> Optional[str]:
    """Why the browser test cannot run here, or None when it can."""
    if find_chromium() is None:
        return "no Chromium binary (apt-get install chromium; .ci/run installs it)"
    try:
        import websocket  # noqa: F401
    except ImportError:
        return "websocket-client is not installed (pip install websocket-client; it is in the test extra)"
    return None


class PageReport(dict):
    """``{"console_errors": [...], "exceptions": [...], "images": [{"alt", "decoded", "width", "height"}],
    "screenshot": path, "title": str}``."""


class _DevTools:
    def __init__(self, ws_url: str, timeout: float):
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=timeout, suppress_origin=True)
        self.next_id = 0
        self.events: List[Dict[str, Any]] = []

    def call(self, method: str, **params) -> Dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.time() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.events.append(json.loads(self.ws.recv()))

    def close(self):
        self.ws.close()


def render(html_path: str, screenshot_path: str, width: int = 1280, timeout: float = 60.0) -> PageReport:
    """Open ``html_path`` in headless Chromium, wait for the load event and every image's ``decode()``, and save a
    full-page PNG screenshot to ``screenshot_path``.

    Raises:
        RuntimeError: no Chromium (see :func:`missing_reason`), or the browser did not start.
    """
    binary = find_chromium()
    if binary is None:
        raise RuntimeError(missing_reason())
    profile = tempfile.mkdtemp(prefix="report-browser-")
    process = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its renderer and helper processes share the group we end at the close
    )
    tools = None
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.time() + timeout
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if process.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{binary} did not start (exit code {process.poll()})")
            time.sleep(0.05)
        port = int(open(port_file).read().split("\n")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as response:
            targets = json.load(response)
        page = next(t for t in targets if t.get("type") == "page")
        tools = _DevTools(page["webSocketDebuggerUrl"], timeout)
        for domain in ("Page", "Runtime", "Log"):
            tools.call(f"{domain}.enable")
        tools.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
        tools.call("Page.navigate", url="file://" + os.path.abspath(html_path))
        tools.wait_for("Page.loadEventFired", timeout)
        decoded = tools.call(
            "Runtime.evaluate",
            expression="Promise.all(Array.from(document.images).map(i => i.decode().then(() => true, () => false)"
            ".then(ok => ({alt: i.alt, decoded: ok && i.naturalWidth > 0, width: i.naturalWidth, "
            "height: i.naturalHeight}))))",
            awaitPromise=True,
            returnByValue=True,
        )["result"]["value"]
        title = tools.call("Runtime.evaluate", expression="document.title", returnByValue=True)["result"]["value"]
        size = tools.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = tools.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": width, "height": min(int(size["height"]), 16000), "scale": 1},
        )
        with open(screenshot_path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        console = [
            e["params"]
            for e in tools.events
            if e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert")
        ]
        logged = [
            e["params"]["entry"]
            for e in tools.events
            if e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error"
        ]
        exceptions = [e["params"] for e in tools.events if e.get("method") == "Runtime.exceptionThrown"]
        return PageReport(
            console_errors=console + logged,
            exceptions=exceptions,
            images=decoded,
            screenshot=screenshot_path,
            title=title,
        )
    finally:
        if tools is not None:
            try:
                tools.call("Browser.close")
            except Exception:  # the browser may already be gone
                pass
            tools.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the group this call started, nothing else
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)
