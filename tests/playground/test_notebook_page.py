"""The playground's notebook view of a session, in a real headless Chromium against
``corral serve`` on loopback: cells run in one session (state kept), a table shown from
an object's text/html, a PNG shown as an image; in the environment ``sci`` with pandas and
matplotlib (marker ``env_build``) ``df.describe()`` as a table and a plot. Screenshots are
saved under ``build/test-artifacts`` (or ``$CORRAL_TEST_ARTIFACTS``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cdp_client import Page, chromium_path, launch

from session_env import CSV
from strict_tier import host_can_sandbox, needs_strict

TOKEN = "notebook-test-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = chromium_path()
BROWSER = pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("CORRAL_REQUIRE_BROWSER") != "1",
    reason="no chromium here (Debian: apt-get install chromium); CI sets "
           "CORRAL_REQUIRE_BROWSER=1 to fail instead")
pytestmark = [BROWSER, needs_strict(host_can_sandbox())]

#: a cell that makes a 160x100 gradient PNG (zlib, no packages) and an HTML table
SETUP = r'''
import struct, zlib
def _chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
class Pic:
    def _repr_png_(self):
        w, h = 160, 100
        raw = b''.join(b'\x00' + b''.join(bytes((x * 255 // w, y * 255 // h, 160))
                                           for x in range(w)) for y in range(h))
        ihdr = struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)
        return (b'\x89PNG\r\n\x1a\n' + _chunk(b'IHDR', ihdr) +
                _chunk(b'IDAT', zlib.compress(raw)) + _chunk(b'IEND', b''))
class Table:
    def _repr_html_(self):
        return ('<table><tr><th>name</th><th>n</th></tr><tr><td>a</td><td>1</td></tr>'
                '<tr><td>b<script>alert(1)</script></td><td>2</td></tr></table>')
    def __repr__(self):
        return 'Table(2 rows)'
count = 41
print('set up')
'''


def artifacts() -> Path:
    out = Path(os.environ.get("CORRAL_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


@contextlib.contextmanager
def serve(tenant: str = "", env: dict[str, str] | None = None) -> Iterator[str]:
    """``corral serve`` on 127.0.0.1 (any free port), one tenant (``tenant``: more TOML
    lines of its table); its base URL. Stopped by SIGTERM to its pid."""
    with tempfile.TemporaryDirectory(prefix="corral-notebook-") as tmp:
        cfg = Path(tmp) / "serve.toml"
        cfg.write_text(f'[server]\nhost = "127.0.0.1"\nport = 0\nsnippet_workers = 1\n\n'
                       f'[[tenants]]\nname = "web"\ntoken = "{TOKEN}"\n{tenant}\n')
        proc = subprocess.Popen([sys.executable, "-m", "corral", "serve", "--config",
                                 str(cfg), "--port", "0"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**os.environ, **(env or {})})
        try:
            assert proc.stderr is not None
            url, seen, deadline = None, [], time.monotonic() + 60
            while url is None and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line:
                    break
                seen.append(line.decode(errors="replace"))
                with contextlib.suppress(ValueError):
                    doc = json.loads(line)
                    if doc.get("event") == "listening":
                        url = doc["url"]
            assert url is not None, "corral serve did not start:\n" + "".join(seen)
            stderr = proc.stderr
            threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
            yield str(url)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def run_cell(page: Page, index: int, code: str) -> str:
    """Put ``code`` in cell ``index`` (0-based), run it, wait for it; its done state."""
    page.eval(f"document.querySelectorAll('.cell textarea')[{index}].value = "
              f"{json.dumps(code)}")
    page.eval(f"document.querySelectorAll('.cell button.run')[{index}].click()")
    state: str = page.wait_for(f"(document.querySelectorAll('.cell')[{index}] || {{}})"
                               ".dataset && document.querySelectorAll('.cell')"
                               f"[{index}].dataset.done", timeout=120)
    return state


def outputs(page: Page, index: int) -> str:
    text: str = page.eval(f"document.querySelectorAll('.cell .outputs')[{index}].textContent")
    return text


def open_notebook(page: Page, environment: str = "") -> None:
    page.wait_for("document.body && document.body.dataset.state === 'ready'")
    assert page.eval("location.hash") == ""  # the token left the address bar
    if environment:
        page.eval(f"document.getElementById('environment').value = {json.dumps(environment)}")
    page.click("#start")
    page.wait_for("document.getElementById('session').textContent.startsWith('session ')",
                  timeout=60)


def test_cells_keep_state_and_show_tables_and_images_in_chromium() -> None:
    assert CHROMIUM is not None, "CORRAL_REQUIRE_BROWSER=1 but there is no chromium"
    with serve() as base, launch(CHROMIUM) as browser:
        page = browser.new_page(f"{base}/playground/notebook.html#token={TOKEN}")
        try:
            open_notebook(page)
            assert run_cell(page, 0, SETUP) == "ok", page.console()
            assert outputs(page, 0) == "set up\n"
            assert run_cell(page, 1, "count + 1") == "ok"
            assert outputs(page, 1) == "42"
            assert run_cell(page, 2, "Table()") == "ok"
            cells = page.eval("[...document.querySelectorAll('.cell')[2]"
                              ".querySelectorAll('td, th')].map(c => c.textContent)")
            assert cells == ["name", "n", "a", "1", "balert(1)", "2"]
            # the script in the table's markup is text, never an element
            assert page.eval("document.querySelectorAll('.cell script').length") == 0
            assert run_cell(page, 3, "Pic()") == "ok"
            page.wait_for("(document.querySelectorAll('.cell')[3].querySelector('img') || {})"
                          ".naturalWidth === 160")
            assert page.eval("document.querySelectorAll('.cell')[3].querySelector('img')"
                             ".naturalHeight") == 100
            assert run_cell(page, 4, "1/0") == "error"
            assert "ZeroDivisionError" in outputs(page, 4)
            page.screenshot(str(artifacts() / "notebook-cells.png"))
        finally:
            page.close()


@pytest.mark.env_build
def test_a_dataframe_and_a_plot_in_chromium(sci_env: str) -> None:
    """The session runs in ``sci`` (named in the page's environment field; the server
    finds the cached store by ``CORRAL_ENV_DIR``, set by the fixture)."""
    assert CHROMIUM is not None, "CORRAL_REQUIRE_BROWSER=1 but there is no chromium"
    with serve(f'environments = ["{sci_env}"]') as base, launch(CHROMIUM) as browser:
        page = browser.new_page(f"{base}/playground/notebook.html#token={TOKEN}")
        try:
            open_notebook(page, sci_env)
            sid = page.eval("document.getElementById('session').textContent.split(' ')[1]")
            status = page.eval(
                f"fetch('/v1/sessions/{sid}/files?path=data.csv', {{method: 'PUT', headers: "
                f"{{authorization: 'Bearer {TOKEN}'}}, body: {json.dumps(CSV)}}})"
                ".then(r => r.status)")
            assert status == 204
            assert run_cell(page, 0, "import pandas as pd; df = pd.read_csv('data.csv')"
                            ) == "ok"
            assert run_cell(page, 1, "df.describe()") == "ok"
            heads = page.eval("[...document.querySelectorAll('.cell')[1]"
                              ".querySelectorAll('th')].map(c => c.textContent)")
            assert "mean" in heads and "a" in heads, heads
            assert run_cell(page, 2, "import matplotlib.pyplot as plt\n"
                            "fig, ax = plt.subplots(figsize=(6, 4), dpi=60)\n"
                            "ax.plot(df.a, df.b, marker='o')\nax.set_title('b by a')\n"
                            "plt.show()") == "ok"
            page.wait_for("(document.querySelectorAll('.cell')[2].querySelector('img') || {})"
                          ".naturalWidth === 360", timeout=60)
            page.eval("document.querySelectorAll('.cell')[1].scrollIntoView()")
            page.screenshot(str(artifacts() / "notebook-plot.png"))
        finally:
            page.close()
