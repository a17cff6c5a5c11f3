"""The README's first screen ("The first hour"), run as written (issue 27: docs).

Every line of its one shell block runs, in order, from the checkout, in a shell whose
state the block itself makes: a line that changes the shell (``. .venv/bin/activate``)
is kept and runs before each later line, as in one terminal; PATH starts as a fresh
shell's (no ``.venv/bin``), HOME is a fresh directory. The block must hold exactly the
lines listed here, so a README edit that changes or breaks a command fails this test.

Bounded, with the reason: ``bash scripts/main.sh`` runs with ``CORRAL_MAIN_NO_INSTALL=1``
(the checkout's .venv as it is; the install needs PyPI, and tests/test_main_job.py does the
same); ``corral serve`` runs with ``--port 0`` added (the machine is shared; 8580 may be
taken), then the page the line's comment names is opened with that port, in headless
Chromium where there is one (a snippet typed and run; without Chromium the page is fetched
and the same snippet sent as the page sends it), and the server is stopped with SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import tomllib
import urllib.request
from collections.abc import Callable
from pathlib import Path
from shutil import which

import pytest

from strict_tier import host_can_sandbox, needs_strict

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
FRESH_PATH = "/usr/local/bin:/usr/bin:/bin"


def first_screen_lines() -> list[str]:
    """The shell block of the README's "The first hour", one line each."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## The first hour\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "one shell block in 'The first hour'"
    return [ln for ln in blocks[0].splitlines() if ln.strip()]


def _code(line: str) -> str:
    """The line without its trailing comment (blanks then '#', as the README writes)."""
    return re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()


def _comment(line: str) -> str:
    parts = re.split(r"\s{2,}#", line, maxsplit=1)
    return parts[1].strip() if len(parts) == 2 else ""


class Shell:
    """One terminal: the lines that change the shell are replayed before each line."""

    def __init__(self, home: Path) -> None:
        self.state: list[str] = []
        self.env = {"PATH": FRESH_PATH, "HOME": str(home), "LANG": "C.UTF-8"}

    def script(self, code: str) -> str:
        return "\n".join(["set -e", *self.state, code])

    def run(self, code: str, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", self.script(code)], cwd=ROOT,
                              env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)


Check = Callable[[Shell, str], None]


def _ok(r: subprocess.CompletedProcess[str], line: str) -> None:
    assert r.returncode == 0, (line, r.stdout[-2000:], r.stderr[-2000:])
    assert "corral: warning" not in r.stderr, r.stderr  # strict here: no fallback


def main_script(sh: Shell, line: str) -> None:
    r = sh.run(_code(line), env={"CORRAL_MAIN_NO_INSTALL": "1"})
    _ok(r, line)
    assert "Strict level: usable" in r.stdout and "raw socket: refused" in r.stdout


def activate(sh: Shell, line: str) -> None:
    r = sh.run(f"{_code(line)}\ncommand -v corral; command -v python3")
    _ok(r, line)
    assert r.stdout.split() == [str(VENV_BIN / "corral"), str(VENV_BIN / "python3")]
    sh.state.append(_code(line))  # this terminal keeps it


def output(*wanted: str, exact: str | None = None) -> Check:
    def check(sh: Shell, line: str) -> None:
        r = sh.run(_code(line))
        _ok(r, line)
        if exact is not None:
            assert r.stdout == exact, (line, r.stdout)
        for w in wanted:
            assert w in r.stdout, (line, w, r.stdout)
    return check


def _playground_token(line: str) -> tuple[str, str]:
    """The page path and token the line's comment names, checked against the config."""
    m = re.search(r"http://127\.0\.0\.1:8580(/playground/)#token=(\S+)", _comment(line))
    assert m is not None, "the serve line's comment names the page and its token"
    cfg = tomllib.loads((ROOT / "examples" / "playground.toml").read_text())
    assert cfg["server"]["port"] == 8580 and cfg["server"]["host"] == "127.0.0.1"
    assert [t["token"] for t in cfg["tenants"]] == [m.group(2)]
    return m.group(1), m.group(2)


def _snippet_over_http(base: str, token: str) -> None:
    with urllib.request.urlopen(f"{base}/playground/", timeout=30) as resp:
        assert resp.status == 200 and "text/html" in resp.headers["content-type"]
    req = urllib.request.Request(f"{base}/v1/snippets", method="POST",
                                 data=json.dumps({"source": "sum(range(10))"}).encode(),
                                 headers={"authorization": f"Bearer {token}",
                                          "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        doc = json.loads(resp.read())
    assert doc["result"] == "45" and doc["level"] == "strict", doc


def _snippet_in_chromium(chromium: str, url: str) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "playground"))
    try:
        from cdp_client import launch
    finally:
        sys.path.remove(str(ROOT / "tests" / "playground"))
    with launch(chromium) as browser:
        page = browser.new_page(url)
        try:
            page.wait_for("document.body && document.body.dataset.state === 'ready'")
            page.wait_for("document.getElementById('who').textContent === 'tenant me'")
            page.eval("document.getElementById('editor').value = 'sum(range(10))'")
            page.click("#run")
            state = page.wait_for("document.body.dataset.state !== 'running' && "
                                  "document.body.dataset.state", timeout=60)
            assert state == "done", page.console()
            assert page.eval("document.getElementById('result').textContent") == "45"
            assert "ran at level strict" in page.eval(
                "document.getElementById('meta').textContent")
        finally:
            page.close()


def serve(sh: Shell, line: str) -> None:
    path, token = _playground_token(line)
    proc = subprocess.Popen(["bash", "-c", sh.script(f"exec {_code(line)} --port 0")],
                            cwd=ROOT, env=sh.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        base = None
        for log in proc.stderr:  # JSON log lines, until it listens
            if '"listening"' in log:
                base = str(json.loads(log)["url"])
                break
        assert base is not None, "corral serve never said it listens"
        stderr = proc.stderr
        threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
        chromium = which("chromium") or which("chromium-browser")
        if chromium is None:
            _snippet_over_http(base, token)
        else:
            _snippet_in_chromium(chromium, f"{base}{path}#token={token}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


#: each line of the block (without its comment) and how it is checked, in order
EXPECTED: list[tuple[str, Check]] = [
    ("bash scripts/main.sh", main_script),
    (". .venv/bin/activate", activate),
    ("corral run -- python3 -c 'print(6 * 7)'", output(exact="42\n")),
    ("corral python 'sum(range(10))'", output("=> 45")),
    ("python3 examples/first_sandbox.py", output(
        "file /work/data/fruit.txt 15", "dir /work/data", "exit strict 3 lines",
        "['apple', 'fig', 'pear']", "data still there: False")),
    ("corral serve --config examples/playground.toml", serve),
    ("python3 examples/mcp_client.py", output(
        "sandbox_list_files", "run_in_sandbox: 120 at strict",
        "run_command: exit hello from Linux", "sandbox_list_files: ['a.txt']")),
]


def test_the_block_is_the_one_this_test_runs() -> None:
    assert [" ".join(_code(ln).split()) for ln in first_screen_lines()] == \
        [code for code, _ in EXPECTED]


@needs_strict(host_can_sandbox())
def test_the_first_screen_runs_as_written(tmp_path: Path) -> None:
    if not (VENV_BIN / "corral").exists():
        pytest.skip("no .venv in the checkout (scripts/main.sh and scripts/test.sh make it)")
    pytest.importorskip("mcp")
    pytest.importorskip("uvicorn")
    if os.environ.get("CORRAL_REQUIRE_BROWSER") == "1":
        assert which("chromium") or which("chromium-browser"), "no chromium here"
    sh = Shell(tmp_path)
    for line, (code, check) in zip(first_screen_lines(), EXPECTED, strict=True):
        assert " ".join(_code(line).split()) == code
        check(sh, line)
