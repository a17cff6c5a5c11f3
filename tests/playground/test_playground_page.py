"""The playground page: its routes and headers (in process), and the page itself in a
real headless Chromium (Debian's ``chromium``, driven over the DevTools protocol) against
``corral serve`` started here on loopback: type code, run, see the transcript; a hostile
snippet shows its validation error. Screenshots are saved under ``build/test-artifacts``
(or ``$CORRAL_TEST_ARTIFACTS``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
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

from strict_tier import host_can_sandbox, needs_strict

TOKEN = "playground-test-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]


def artifacts() -> Path:
    out = Path(os.environ.get("CORRAL_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


# -- the routes, in process -------------------------------------------------------------
def test_routes_serve_the_page_with_a_strict_policy() -> None:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from corral.serve import playground
    with TestClient(Starlette(routes=playground.routes())) as client:
        for path in ("/", "/playground"):
            r = client.get(path, follow_redirects=False)
            assert r.status_code == 307 and r.headers["location"] == "/playground/"
        page = client.get("/playground/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
            r = client.get(f"/playground/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
            assert r.headers["content-security-policy"] == csp
        for bad in ("/playground/secret.py", "/playground/..%2Fplayground.py",
                    "/playground/%2e%2e/app.py"):
            assert client.get(bad).status_code == 404


def test_the_page_loads_nothing_from_elsewhere() -> None:
    """No CDN, no remote font or script: the machine may have no internet."""
    from corral.serve.playground import FILES, STATIC_DIR
    for name in FILES:
        text = (STATIC_DIR / name).read_text()
        assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), name
        assert "innerHTML" not in text and "eval(" not in text, name
    assert sorted(p.name for p in STATIC_DIR.iterdir()) == sorted(FILES)


# -- the page in Chromium against corral serve ------------------------------------------
@contextlib.contextmanager
def serve() -> Iterator[str]:
    """``corral serve`` (its Python entry) on 127.0.0.1, any free port, one tenant; its
    base URL. Stopped by SIGTERM to its pid."""
    with tempfile.TemporaryDirectory(prefix="corral-playground-") as tmp:
        cfg = Path(tmp) / "serve.toml"
        cfg.write_text(f'[server]\nhost = "127.0.0.1"\nport = 0\nsnippet_workers = 1\n\n'
                       f'[[tenants]]\nname = "web"\ntoken = "{TOKEN}"\n')
        code = ("import sys\nfrom corral.serve.config import load_config\n"
                "from corral.serve.server import serve\n"
                "sys.exit(serve(load_config(sys.argv[1])))\n")
        proc = subprocess.Popen([sys.executable, "-c", code, str(cfg)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
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


def set_source(page: Page, text: str) -> None:
    """Empty the editor, focus it, and type ``text`` key by key (newlines and tabs as
    key presses, so the editor's own indentation handling is what shapes the source)."""
    page.eval("document.getElementById('editor').value = ''")
    page.click("#editor")
    page.type_text(text)


def run_and_wait(page: Page) -> str:
    page.click("#run")
    page.wait_for("document.body.dataset.state === 'running' || "
                  "document.body.dataset.state === 'done' || "
                  "document.body.dataset.state === 'error'")
    state: str = page.wait_for("document.body.dataset.state !== 'running' && "
                               "document.body.dataset.state", timeout=60)
    return state


def text_of(page: Page, element_id: str) -> str:
    value: str = page.eval(f"document.getElementById('{element_id}').textContent")
    return value


CHROMIUM = chromium_path()
BROWSER = pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("CORRAL_REQUIRE_BROWSER") != "1",
    reason="no chromium here (Debian: apt-get install chromium); CI sets "
           "CORRAL_REQUIRE_BROWSER=1 to fail instead")


@BROWSER
@needs_strict(host_can_sandbox())
def test_type_run_and_see_the_transcript_in_chromium() -> None:
    assert CHROMIUM is not None, "CORRAL_REQUIRE_BROWSER=1 but there is no chromium"
    out = artifacts()
    with serve() as base, launch(CHROMIUM) as browser:
        page = browser.new_page(f"{base}/playground/#token={TOKEN}")
        try:
            page.wait_for("document.body && document.body.dataset.state === 'ready'")
            # the token came in the fragment and left the address bar
            assert page.eval("location.hash") == ""
            assert page.eval("document.getElementById('token').value") == TOKEN
            # GET /v1/info: whose token, and the levels the server offers
            page.wait_for("document.getElementById('who').textContent === 'tenant web'")

            # typed as a person types it: Enter keeps the indentation (and adds a level
            # after a colon), Shift+Tab takes one away, Tab inserts four spaces
            set_source(page, "import math\ndef double(n):\nreturn n * 2\n")
            page.key("Tab", "", 9, modifiers=8)  # Shift+Tab
            page.type_text("x = double(21)\nprint('x is', x)\nfor i in range(2):\n"
                           "print('line', i)\n")
            page.key("Tab", "", 9, modifiers=8)
            page.type_text("if x:\n")
            page.key("Tab", "", 9, modifiers=8)
            page.type_text("\tr = math.sqrt(16)  # a tab indents\n")
            page.key("Tab", "", 9, modifiers=8)
            page.type_text("x")
            source = page.eval("document.getElementById('editor').value")
            assert source == ("import math\ndef double(n):\n    return n * 2\n"
                              "x = double(21)\nprint('x is', x)\nfor i in range(2):\n"
                              "    print('line', i)\nif x:\n    r = math.sqrt(16)  # a tab "
                              "indents\nx"), source

            assert run_and_wait(page) == "done", page.console()
            assert text_of(page, "status") == "ok"
            assert text_of(page, "result") == "42"
            assert text_of(page, "output") == "x is 42\nline 0\nline 1\n"
            facts = json.loads(text_of(page, "facts"))
            assert facts["x"] == 42 and facts["r"] == 4.0 and facts["i"] == 1
            assert text_of(page, "errors") == ""
            assert "ran at level strict" in text_of(page, "meta")
            page.screenshot(str(out / "playground-run.png"))

            # a hostile snippet: refused by the validator, unrun, the error shown
            set_source(page, "import os\nos.system('id')")
            assert run_and_wait(page) == "done"
            assert text_of(page, "status") == "rejected by the validator (not run)"
            kinds = page.eval("[...document.querySelectorAll('#errors .error')]"
                              ".map(e => [e.dataset.type, e.dataset.code || ''])")
            assert ["ValidationError", "forbidden-import"] in kinds
            assert "import of 'os' is not allowed" in text_of(page, "errors")
            assert text_of(page, "output") == "" and text_of(page, "result") == ""
            page.screenshot(str(out / "playground-rejected.png"))

            # an error at run time: its type, message and traceback; Ctrl+Enter runs
            set_source(page, "a = [1]\nprint('before')\na[3]")
            page.key("Enter", "\r", 13, modifiers=2)
            page.wait_for("document.body.dataset.state === 'done'", timeout=60)
            assert text_of(page, "status") == "raised IndexError"
            assert "IndexError" in text_of(page, "errors")
            assert text_of(page, "output") == "before\n"
            assert json.loads(text_of(page, "facts")) == {"a": [1]}

            # Stop: the page drops the request, the server cancels the run and frees its
            # slot at once (one snippet worker: the next run would wait out the 10 s loop)
            set_source(page, "while True:\npass")
            page.eval("document.getElementById('timeout').value = '10000'")
            page.click("#run")
            page.wait_for("document.body.dataset.state === 'running'")
            time.sleep(0.5)
            page.click("#stop")
            page.wait_for("document.body.dataset.state === 'error'", timeout=5)
            assert text_of(page, "status").startswith("stopped")
            set_source(page, "6 * 7")
            t0 = time.monotonic()
            assert run_and_wait(page) == "done" and text_of(page, "result") == "42"
            assert time.monotonic() - t0 < 5, "the stopped run still held the only slot"

            # a wrong token: the API's error, with its code
            page.eval("document.getElementById('token').value = 'not-the-token'")
            assert run_and_wait(page) == "error"
            assert text_of(page, "status") == "error: unauthorized"
            page.eval("document.getElementById('token').dispatchEvent(new Event('change'))")
            page.wait_for("document.getElementById('who').textContent === 'token refused'")
            page.screenshot(str(out / "playground-unauthorized.png"))
        finally:
            page.close()

        # a link corral mcp answers with (seed 02's playgroundUrl): the page opens with
        # that snippet in the editor
        from corral.mcp.server import playground_link
        source = "word = 'héllo ✓'\nlen(word)"
        link = playground_link(f"{base}/playground/", source)
        assert link is not None
        page = browser.new_page(f"{link}&token={TOKEN}")
        try:
            page.wait_for("document.body && document.body.dataset.state === 'ready'")
            assert page.eval("document.getElementById('editor').value") == source
            assert page.eval("location.hash") == ""
            assert run_and_wait(page) == "done" and text_of(page, "result") == "7"
        finally:
            page.close()
    assert (out / "playground-run.png").stat().st_size > 1000
