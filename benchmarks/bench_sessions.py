"""Sessions (issue 30): create, a trivial cell, a cell through serve, side by side with a
stdlib snippet; memory per idle session.

    .venv/bin/python benchmarks/bench_sessions.py [--runs 200] [--creates 20]
                                                  [--environment NAME]

``--environment``: a built environment with pandas and matplotlib (``corral env build
sci numpy pandas matplotlib``; the store is ``$CORRAL_ENV_DIR`` or the default one).

Library: ``AsyncSession.create`` on one strict provider (its spare sandbox warm, as a
server's), then ``run("1+1")`` ``--runs`` times: p50 / p99; next to it a warm
``run_snippet("1+1")`` through a SnippetPool of the same provider kind (one-shot, clean
every time). Serve: a server subprocess on 127.0.0.1; ``POST /v1/sessions/{id}/cells``
against ``POST /v1/snippets`` with the same source (httpx, one keep-alive connection).
Memory: private memory (Private_Clean + Private_Dirty, /proc/PID/smaps_rollup) of every
process of one idle session's sandbox (its agent and the interpreter); with
``--environment`` also session create in it (next to create without one) and the memory
after ``import pandas, matplotlib.pyplot`` (what an agent's notebook holds).
No assertions: figures, printed as JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corral.providers.linux import LinuxProvider, LinuxSandbox
from corral.sessions import AsyncSession
from corral.snippets.host.pool import SnippetPool
from corral.snippets.host.runner import run_snippet


def private_kib(pid: int) -> int:
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1])
    except OSError:
        return 0
    return total


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p / 100 * len(s)))], 3)


def summary(name: str, xs: list[float]) -> dict[str, Any]:
    return {"what": name, "n": len(xs), "p50_ms": pct(xs, 50), "p99_ms": pct(xs, 99),
            "mean_ms": round(statistics.fmean(xs), 3)}


def session_mem(s: AsyncSession) -> dict[str, int]:
    sb = s.sandbox
    assert isinstance(sb, LinuxSandbox)
    pids = sb.host_pids()
    return {"processes": len(pids), "private_kib": sum(private_kib(p) for p in pids)}


async def creating(p: LinuxProvider, creates: int, environment: str | None) -> list[float]:
    made: list[float] = []
    for _ in range(creates):
        t = time.perf_counter()
        s = await AsyncSession.create(provider=p, environment=environment)
        made.append((time.perf_counter() - t) * 1000)
        await s.close()
    return made


async def library(runs: int, creates: int, environment: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with LinuxProvider() as p:
        out.append(summary("session create (strict sandbox + interpreter ready)",
                           await creating(p, creates, None)))
        if environment:
            out.append(summary(f"session create in environment {environment!r}",
                               await creating(p, creates, environment)))
        async with await AsyncSession.create(provider=p, environment=environment) as s:
            await s.run("1+1")
            xs = []
            for _ in range(runs):
                t = time.perf_counter()
                r = await s.run("1+1")
                xs.append((time.perf_counter() - t) * 1000)
                assert r.result is not None and r.result.text() == "2"
            out.append(summary("session cell 1+1 (library)", xs))
            await asyncio.sleep(0.5)
            out.append({"what": "idle session memory", **session_mem(s)})
            if environment:
                t = time.perf_counter()
                r = await s.run("import pandas, matplotlib.pyplot", timeout_s=120)
                took = (time.perf_counter() - t) * 1000
                assert r.ok, r.error
                out.append({"what": "idle session memory after import pandas, "
                            "matplotlib.pyplot", "import_ms": round(took, 1), **session_mem(s)})
    async with SnippetPool() as pool:
        await run_snippet("1+1", pool=pool)
        xs = []
        for _ in range(runs):
            t = time.perf_counter()
            tr = await run_snippet("1+1", pool=pool)
            xs.append((time.perf_counter() - t) * 1000)
            assert tr.result == "2", tr
        out.append(summary("snippet 1+1 (library, warm pool)", xs))
    return out


def serve(runs: int) -> list[dict[str, Any]]:
    import httpx
    token = "bench-sessions-token-0123456789"
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "serve.toml"
        cfg.write_text(f'[server]\nsnippet_workers = 2\n\n[levels]\nstrict = "linux"\n\n'
                       f'[[tenants]]\nname = "b"\ntoken = "{token}"\nlevels = ["strict"]\n'
                       "max_runs = 8\n")
        proc = subprocess.Popen([sys.executable, "-m", "corral", "serve", "--config",
                                 str(cfg), "--port", "0"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            assert proc.stderr is not None
            url = None
            for raw in proc.stderr:
                doc = json.loads(raw) if raw.startswith(b"{") else {}
                if doc.get("event") == "listening":
                    url = doc["url"]
                    break
            assert url is not None
            import threading
            err = proc.stderr
            threading.Thread(target=lambda: [None for _ in err], daemon=True).start()
            out = []
            with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"},
                              timeout=60) as c:
                t = time.perf_counter()
                sid = c.post("/v1/sessions").json()["id"]
                out.append({"what": "serve: POST /v1/sessions (first)",
                            "ms": round((time.perf_counter() - t) * 1000, 1)})
                for name, path, body in (
                        ("serve: session cell 1+1", f"/v1/sessions/{sid}/cells",
                         {"code": "1+1"}),
                        ("serve: snippet 1+1", "/v1/snippets", {"source": "1+1"})):
                    for _ in range(5):
                        c.post(path, json=body)
                    xs = []
                    for _ in range(runs):
                        t = time.perf_counter()
                        r = c.post(path, json=body)
                        xs.append((time.perf_counter() - t) * 1000)
                        assert r.status_code == 200, r.text
                    out.append(summary(name, xs))
                c.delete(f"/v1/sessions/{sid}")
            return out
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--creates", type=int, default=20)
    ap.add_argument("--environment", default=None, metavar="NAME",
                    help="a built environment with pandas and matplotlib")
    a = ap.parse_args()
    rows = asyncio.run(library(a.runs, a.creates, a.environment)) + serve(a.runs)
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
