"""Smoke tests of an installed corral (a wheel, not the source tree): strict, snippet,
handler and serve, each from the installed package's own files.

Run by scripts/test-wheel.sh with the fresh venv's interpreter, ``-I`` and a cwd outside
the checkout, so nothing can come from the source tree: the first check is that
``corral.__file__`` is in the venv's site-packages. Exits 1 at the first failure, naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

import corral

SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
BIN = Path(sys.executable).parent


def check(what: str, ok: bool, detail: object = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if not ok else ""))
    if not ok:
        sys.exit(1)


def installed() -> None:
    here = Path(corral.__file__).resolve()
    check("corral comes from the installed wheel", here.is_relative_to(SITE), here)
    pkg = here.parent
    for rel in ("py.typed", "serve/playground/index.html", "serve/playground/app.js",
                "serve/playground/style.css", "handler/entrypoint.py",
                "snippets/sandbox/__init__.py"):
        check(f"the wheel carries corral/{rel}", (pkg / rel).is_file(), pkg / rel)
    check("the wheel carries _corral_cli", (SITE / "_corral_cli.py").is_file())
    check("the corral script is installed", (BIN / "corral").is_file())


def strict() -> None:
    r = subprocess.run([str(BIN / "corral"), "run", "--level", "strict", "--mem-mb", "128",
                        "--timeout", "20000", "--", sys.executable, "-I", "-S", "-c",
                        "import os; print(os.getuid(), os.uname().nodename)"],
                       capture_output=True, text=True, timeout=120)
    check("corral run --level strict", (r.returncode, r.stdout) == (0, "0 sandbox\n"),
          (r.returncode, r.stdout, r.stderr[-2000:]))


def snippet() -> None:
    t = corral.run_snippet_sync("print(sum(range(10)))\n6 * 7", level="strict")
    d = t.to_dict()
    check("run_snippet_sync at strict", not t.errors and "45" in json.dumps(d), d)


def handler() -> None:
    from corral.handler import entrypoint_script

    script = Path(entrypoint_script()).resolve()
    check("the handler entrypoint is the installed one", script.is_relative_to(SITE), script)
    with tempfile.TemporaryDirectory() as d:
        Path(d, "h.py").write_text("def handler(payload, ctx):\n    return payload + 1\n")
        invoke = ('{"v":1,"kind":"invoke","input":2,"ctx":{"runId":"r","tenantId":"t",'
                  '"dryRun":false,"state":{},"nodeOutputs":{}}}\n')
        r = subprocess.run([sys.executable, "-I", str(script), "h.py:handler"],
                           input=invoke, capture_output=True, text=True, cwd=d, timeout=60)
    check("the handler entrypoint answers a frame",
          r.stdout == '{"v":1,"kind":"output","output":3}\n', (r.stdout, r.stderr[-2000:]))


def serve(config: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        log = Path(d, "serve.log")
        with open(log, "wb") as f:
            p = subprocess.Popen([str(BIN / "corral"), "serve", "--config", config,
                                  "--port", "0"], stdout=subprocess.DEVNULL, stderr=f)
        try:
            port, deadline = 0, time.monotonic() + 60
            while not port and time.monotonic() < deadline and p.poll() is None:
                for line in log.read_text().splitlines():
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") == "listening":
                        port = int(ev["port"])
                time.sleep(0.1)
            check("corral serve listens", port > 0, log.read_text()[-2000:])
            base = f"http://127.0.0.1:{port}"
            with urllib.request.urlopen(f"{base}/v1/health", timeout=30) as r:
                check("GET /v1/health", r.status == 200, r.status)
            with urllib.request.urlopen(f"{base}/", timeout=30) as r:
                page = r.read().decode()
            check("the playground page is served from the wheel", "<html" in page.lower(),
                  page[:200])
        finally:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def main() -> None:
    check("cwd outside the checkout", not Path("pyproject.toml").exists(), os.getcwd())
    installed()
    strict()
    snippet()
    handler()
    serve(sys.argv[1])
    print("installed corral: every smoke test passed")


if __name__ == "__main__":
    main()
