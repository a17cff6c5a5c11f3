"""SIGTERM drains: with runs in flight (a streamed exec, a one-shot run, a snippet, a
started process, in strict and context-isolated sandboxes) the server stops accepting,
cancels what does not finish within its grace, destroys every sandbox and exits 0,
leaving no process, cgroup, mount or temp dir; a restart finds nothing to reap."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from servehelp import ALICE, CAROL, Server, config_text, metric, wait_metric

from strict_tier import host_can_sandbox

PY = sys.executable
STRICT_WHY = host_can_sandbox()
_ROOMY = "max_runs = 16\nmax_sandboxes = 16\nmax_memory_mb = 16384"


def _mounts() -> set[str]:
    with open("/proc/self/mountinfo") as fh:
        return {" ".join(line.split()[3:5]) for line in fh}


def _with_marker(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


def _cgroups_of(pid: int) -> list[str]:
    if STRICT_WHY:
        return []
    from corral.providers.linux.host.cgroups import CgroupManager
    m = CgroupManager()
    if m.support.version == "none":
        return []
    return [n for n in m.list_cgroups() if f"-{pid}-" in n]


def _post(c: httpx.Client, path: str, body: dict[str, Any]) -> int:
    try:
        return c.post(path, json=body, timeout=60).status_code
    except httpx.HTTPError:
        return -1  # the server went away mid-answer: fine, it was told to stop


def test_sigterm_with_runs_in_flight_leaves_nothing(tmp_path: Path) -> None:
    levels = {"context-isolated": "subproc"}
    if not STRICT_WHY:
        levels = {"strict": "linux", **levels}
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    mounts_before = _mounts()
    marker = f"corral-sigterm-{os.getpid()}-{time.monotonic_ns()}"
    sleeper = [PY, "-c", "import time, sys; print('up', flush=True); time.sleep(60)", marker]
    server = Server(tmp_path / "srv", config_text(levels, grace_s=1.0, carol=_ROOMY),
                    env={"TMPDIR": str(tmpdir)}, reaper=True)
    try:
        with server.client(CAROL) as c, concurrent.futures.ThreadPoolExecutor(8) as pool:
            sids = []
            for lv in levels:
                spec = {"level": lv, "network": {
                    "kind": "unrestricted" if lv == "context-isolated" else "none"}}
                sid = c.post("/v1/sandboxes", json={"spec": spec}).json()["id"]
                sids.append(sid)
                c.put(f"/v1/sandboxes/{sid}/files", params={"path": "f.txt"}, content=b"x")
                r = c.post(f"/v1/sandboxes/{sid}/processes", json={"argv": sleeper})
                assert r.status_code == 201, r.text
            inflight = [pool.submit(_post, c, f"/v1/sandboxes/{sid}/exec",
                                    {"argv": sleeper, "stream": True}) for sid in sids]
            inflight += [pool.submit(_post, c, "/v1/runs", {"argv": sleeper, "level": lv,
                                                           "stream": True})
                         for lv in levels]
            inflight.append(pool.submit(_post, c, "/v1/snippets", {
                "source": "while True:\n    pass", "timeout_ms": 10000}))
            # the four 60 s runs in flight (the snippet too, unless its 10 s ran out first
            # on a loaded machine)
            deadline = time.monotonic() + 60
            while (metric(server, 'corral_runs_in_flight{tenant="carol"}') or 0) < 4:
                assert time.monotonic() < deadline, server.log_path.read_text()[-3000:]
                time.sleep(0.05)
            assert _with_marker(marker), "the commands did not start"
            t0 = time.monotonic()
            code = server.stop(signal.SIGTERM, 60)  # by its pid
            took = time.monotonic() - t0
            statuses = [f.result() for f in inflight]
    finally:
        server.stop(signal.SIGKILL)  # only if it is still running (closes its log)
    assert code == 0, server.log_path.read_text()[-3000:]
    assert took < 20, f"the drain took {took:.1f} s (grace 1 s)"
    events = [e["event"] for e in server.logs()]
    assert "draining" in events and "drained" in events and events[-1] == "stopped"
    drained = next(e for e in server.logs() if e["event"] == "drained")
    assert drained["sandboxes_destroyed"] == len(levels)
    assert all(s in (-1, 200, 499, 503) for s in statuses), statuses
    assert server.leftovers() == [], "processes left behind"
    assert _with_marker(marker) == []
    assert os.listdir(tmpdir) == [], f"temp dirs left: {os.listdir(tmpdir)}"
    assert _cgroups_of(server.pid) == []
    assert _mounts() - mounts_before == set()
    # a restart finds nothing left behind to reap
    again = Server(tmp_path / "again", config_text(levels), env={"TMPDIR": str(tmpdir)})
    try:
        ev = next(e for e in again.logs() if e["event"] == "providers")
        assert all(not v for v in ev["reaped_orphans"].values()), ev["reaped_orphans"]
        with again.client(ALICE) as c:
            assert c.get("/v1/sandboxes").json()["sandboxes"] == []
        assert metric(again, 'corral_sandboxes_alive{tenant="alice"}') == 0
    finally:
        assert again.stop() == 0
    assert os.listdir(tmpdir) == []


def test_draining_server_refuses_new_work(tmp_path: Path) -> None:
    """While a run keeps the drain waiting, a new request on an open connection is 503."""
    server = Server(tmp_path, config_text({"context-isolated": "subproc"}, grace_s=3.0))
    try:
        with server.client(ALICE) as c, server.client(ALICE) as c2, \
                concurrent.futures.ThreadPoolExecutor(2) as pool:
            sid = c.post("/v1/sandboxes", json={"spec": {
                "level": "context-isolated", "network": {"kind": "unrestricted"}}}).json()["id"]
            c2.get("/v1/info")  # c2's connection is open before the signal
            slow = pool.submit(_post, c, f"/v1/sandboxes/{sid}/exec", {
                "argv": [PY, "-c", "import time; time.sleep(1)"]})
            wait_metric(server, 'corral_runs_in_flight{tenant="alice"}', 1)
            os.kill(server.pid, signal.SIGTERM)
            time.sleep(0.3)
            try:
                r = c2.get("/v1/info")
                assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
            except httpx.HTTPError:
                pass  # uvicorn closed the idle connection first: also a refusal
            assert slow.result() == 200  # finished within the grace
            assert server.proc.wait(30) == 0
    finally:
        server.stop(signal.SIGKILL)  # only if it is still running (closes its log)
    assert any(e["event"] == "drained" for e in server.logs())


pytestmark = pytest.mark.slow
