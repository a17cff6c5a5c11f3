"""A small Chrome DevTools Protocol client for the playground test: a headless Chromium
started here (Debian's ``chromium``), one page driven over its websocket.

The websocket is RFC 6455 over a plain loopback socket, written here with the standard
library (no websocket package is installed): text frames, client masking, continuation
frames, ping/pong and close. Enough for CDP; nothing else uses it.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

__all__ = ["Browser", "Page", "chromium_path", "launch"]


def chromium_path() -> str | None:
    """The Chromium binary (``CORRAL_CHROMIUM`` overrides), or None if there is none."""
    env = os.environ.get("CORRAL_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class WebSocket:
    """A blocking websocket client (RFC 6455) on loopback."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        m = re.fullmatch(r"ws://([^/:]+):(\d+)(/.*)", url)
        assert m, url
        host, port, path = m.group(1), int(m.group(2)), m.group(3)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the websocket handshake was cut")
            head += chunk
        head, self._buf = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"websocket refused: {head[:200]!r}")

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the websocket closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def recv(self) -> str:
        """The next text message (pings answered, continuations joined)."""
        parts: list[bytes] = []
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else b""
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("the websocket was closed by the peer")
            if opcode in (0x0, 0x1, 0x2):
                parts.append(payload)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send_frame(0x8, b"")
        self.sock.close()


class Page:
    """One page target, driven by CDP commands; events are kept for diagnostics."""

    def __init__(self, ws_url: str) -> None:
        self.ws = WebSocket(ws_url)
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self.events.append(msg)

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                      awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression} stayed falsy; console: {self.console()}")
            time.sleep(0.05)

    def console(self) -> list[str]:
        """What the page logged and threw (from the events seen so far)."""
        out = []
        for ev in self.events:
            if ev.get("method") == "Runtime.consoleAPICalled":
                out.append(" ".join(str(a.get("value", a.get("description", "")))
                                    for a in ev["params"]["args"]))
            elif ev.get("method") == "Runtime.exceptionThrown":
                out.append(str(ev["params"]["exceptionDetails"]))
        return out

    # -- input, as a person gives it ---------------------------------------------------
    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the middle of the element."""
        box = self.eval(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                        ".getBoundingClientRect(); return [r.x + r.width / 2, "
                        "r.y + r.height / 2]; })()")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                      clickCount=1)

    def type_text(self, text: str) -> None:
        """Type ``text`` into the focused element: each line as inserted text, each new
        line and tab as a key press (so the page's key handlers see them)."""
        for i, line in enumerate(text.split("\n")):
            if i:
                self.key("Enter", "\r", 13)
            for j, chunk in enumerate(line.split("\t")):
                if j:
                    self.key("Tab", "", 9)
                if chunk:
                    self.call("Input.insertText", text=chunk)

    def key(self, key: str, text: str, code: int, modifiers: int = 0) -> None:
        down: dict[str, Any] = {"type": "keyDown", "key": key, "code": key,
                                "windowsVirtualKeyCode": code, "modifiers": modifiers}
        if text:
            down["text"] = text
        self.call("Input.dispatchKeyEvent", **down)
        self.call("Input.dispatchKeyEvent", type="keyUp", key=key, code=key,
                  windowsVirtualKeyCode=code, modifiers=modifiers)

    def screenshot(self, path: str) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        self.ws.close()


class Browser:
    """A headless Chromium with a private profile, stopped by its pid."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, profile: str) -> None:
        self.proc, self.port, self.profile = proc, port, profile

    def new_page(self, url: str) -> Page:
        """A new tab navigated to ``url`` (through CDP, so a ``#fragment`` survives)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?about:blank",
                                     method="PUT")
        with urllib.request.urlopen(req, timeout=30) as resp:
            target = json.load(resp)
        page = Page(target["webSocketDebuggerUrl"])
        page.call("Page.enable")
        page.call("Runtime.enable")
        page.call("Page.navigate", url=url)
        return page


_LISTENING = re.compile(rb"DevTools listening on ws://127\.0\.0\.1:(\d+)/")


@contextlib.contextmanager
def launch(binary: str) -> Iterator[Browser]:
    """Start headless Chromium (``--no-sandbox``: the tests run as root; a private
    ``--user-data-dir``); SIGTERM (then SIGKILL) to its pid and its profile removed at
    the end."""
    profile = tempfile.mkdtemp(prefix="corral-chromium-")
    # its temp dir inside the profile: Chromium makes an org.chromium.Chromium.* dir (the
    # profile's SingletonSocket) in $TMPDIR and leaves it when killed (3 a run were left)
    tmp = os.path.join(profile, "tmp")
    os.mkdir(tmp)
    proc = subprocess.Popen(
        [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-sync",
         "--disable-background-networking", "--disable-component-update",
         "--disable-dev-shm-usage", "--mute-audio", "--window-size=1280,900",
         f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": tmp}, start_new_session=True)
    try:
        assert proc.stderr is not None
        seen = b""
        deadline = time.monotonic() + 60
        port = None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
            m = _LISTENING.search(line)
            if m:
                port = int(m.group(1))
                break
        assert port is not None, f"chromium did not start: {seen.decode(errors='replace')}"
        stderr = proc.stderr
        import threading  # drain its stderr so it never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
        yield Browser(proc, port, profile)
    finally:
        if proc.poll() is None:
            # its own session (start_new_session): the group is chromium and its helpers
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # a helper of its group left behind
        if proc.stderr is not None:
            proc.stderr.close()
        shutil.rmtree(profile, ignore_errors=True)
